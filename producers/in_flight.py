"""A sample being generated on a rollout worker: its prompt, the trajectories finished so far,
the segments (and their weight versions) each has grown across syncs, and the ones a sync cut
short, waiting to be continued. It builds the Sample and the partial record the log holds."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from asyncrl.kafka import Record
from asyncrl.producers.agent.state import AgentState, Phase
from asyncrl.producers.reward import Scored
from asyncrl.producers.spans import SampleTrace
from asyncrl.schemas.partial import PartialSample
from asyncrl.schemas.prompt import PromptRecord
from asyncrl.schemas.sample import Sample, Trajectory


@dataclass
class InFlight:
    """A sample being generated: its prompt and the trajectories finished so far."""

    prompt: Record[PromptRecord]
    prompt_ids: list[int]
    version_start: int
    t_start: float
    done: dict[int, Trajectory] = field(default_factory=dict)
    segments: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    """Per trajectory: (segment_starts, segment_versions), grown at each continuation."""
    interrupted: dict[int, AgentState] = field(default_factory=dict)
    """Trajectories cut short by a sync, waiting to be continued."""
    trace: SampleTrace = field(default_factory=SampleTrace)

    def segments_of(self, index: int) -> tuple[list[int], list[int]]:
        return self.segments.setdefault(index, ([0], [self.version_start]))

    def trajectory(
        self,
        index: int,
        state: AgentState,
        reward: float,
        t_end: float,
        reward_s: float = 0.0,
        scored: Scored | None = None,
    ) -> Trajectory:
        """Trajectory ``index`` as generated so far, with its segments and their versions
        (``scored``: its reward's failure and extra numbers, if it has been scored)."""
        starts, versions = self.segments_of(index)
        done = state.phase == Phase.TERMINATED
        return Trajectory(
            response_ids=list(state.response_ids),
            response_logprobs=list(state.response_logprobs),
            response_mask=list(state.response_mask),
            reward=reward,
            finish_reason=state.finish_reason if done else "abort",
            num_turns=state.num_turns,
            tool_calls=state.tool_calls,
            tool_errors=state.tool_errors,
            tool_s=state.tool_seconds,
            param_version=versions[-1],
            param_version_start=versions[0],
            segment_starts=list(starts),
            segment_versions=list(versions),
            t_start=self.t_start,
            t_end=t_end,
            reward_s=reward_s,
            reward_error=scored.error if scored else "",
            reward_extra=json.dumps(scored.extra) if scored and scored.extra else "",
        )

    def sample(self, sample_id: str, worker_id: int, trajectories: list[Trajectory]) -> Sample:
        p = self.prompt.value
        return Sample(
            sample_id=sample_id,
            prompt_id=p.prompt_id,
            worker_id=worker_id,
            prompt_ids=self.prompt_ids,
            ground_truth=p.ground_truth,
            trajectories=trajectories,
        )

    def partial(
        self, sample_id: str, worker_id: int, n: int, version: int, now: float
    ) -> PartialSample:
        """The record ``partials`` keeps of this sample, cut short at ``version``: its finished
        trajectories, the interrupted ones' tokens so far and their agent states."""
        trajectories = [
            self.done[i] if i in self.done else self.trajectory(i, self.interrupted[i], 0.0, now)
            for i in range(n)
        ]
        return PartialSample(
            sample=self.sample(sample_id, worker_id, trajectories),
            interrupted_at_version=version,
            prompt_partition=self.prompt.partition,
            prompt_offset=self.prompt.offset,
            epoch=self.prompt.value.epoch,
            agent_state=[
                self.interrupted[i].to_json() if i in self.interrupted else "" for i in range(n)
            ],
        )

    @classmethod
    def from_partial(cls, rec: Record[PromptRecord], partial: PartialSample) -> InFlight:
        """A sample a previous incarnation logged to ``partials``, to be continued."""
        s = partial.sample
        fl = cls(
            rec,
            list(s.prompt_ids),
            version_start=min(t.param_version_start for t in s.trajectories),
            t_start=min(t.t_start for t in s.trajectories),
        )
        for i, t in enumerate(s.trajectories):
            if t.finish_reason != "abort":
                fl.done[i] = t
                continue
            fl.segments[i] = (list(t.segment_starts), list(t.segment_versions))
            if partial.agent_state[i]:
                fl.interrupted[i] = AgentState.from_json(partial.agent_state[i])
            else:  # logged before agent states were: one turn, cut while generating
                fl.interrupted[i] = AgentState(
                    prompt_ids=list(s.prompt_ids),
                    phase=Phase.GENERATING,
                    response_ids=list(t.response_ids),
                    response_mask=list(t.response_mask),
                    response_logprobs=list(t.response_logprobs),
                )
        return fl
