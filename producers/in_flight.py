"""The samples a rollout worker is generating.

``InFlight`` is one sample: its prompt, the trajectories finished so far, the segments (and
their weight versions) each has grown across syncs, and the ones a sync cut short, waiting to
be continued. It builds the Sample and the partial record the log holds.

``InFlightSamples`` is all of them, by sample id, with the moves partial rollout makes on them
(mode d): interrupt trajectories and log their samples to ``partials``, continue them under a
new version as a new segment, continue a sample a previous incarnation logged.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from asyncrl.config.offpolicy import FilterGroupsConfig
from asyncrl.consumers.dynamic_sampling import no_signal
from asyncrl.kafka import Record
from asyncrl.kafka.interfaces import Sink
from asyncrl.producers.agent.runner import AgentRunner
from asyncrl.producers.agent.state import AgentState, Phase
from asyncrl.producers.reward import Scored
from asyncrl.producers.spans import SampleTrace
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas.partial import TAG as PARTIAL_TAG
from asyncrl.schemas.partial import PartialSample, encode_partial
from asyncrl.schemas.prompt import PromptRecord
from asyncrl.schemas.sample import (
    NO_SIGNAL_HEADER,
    WORKER_HEADER,
    Sample,
    Trajectory,
    encode_sample,
)
from asyncrl.schemas.sample import TAG as SAMPLE_TAG


def generated(state: AgentState, **fields: Any) -> Trajectory:
    """The trajectory ``state`` holds: its tokens (copies: a cut trajectory's lists grow on
    when it continues) and the agent loop's counts, with ``fields`` (its versions, times)."""
    return Trajectory(
        response_ids=np.array(state.response_ids, np.int32),
        response_logprobs=np.array(state.response_logprobs, np.float32),
        response_mask=np.array(state.response_mask, np.int8),
        reward=0.0,  # until scored: with_score
        num_turns=state.num_turns,
        tool_calls=state.tool_calls,
        tool_errors=state.tool_errors,
        tool_s=state.tool_seconds,
        turn_scores=list(state.turn_scores),
        **fields,
    )


def with_score(trajectory: Trajectory, result: Scored, seconds: float, **fields: Any) -> Trajectory:
    """``trajectory`` with its reward: the score, how long it took, the reward function's
    failure (then 0, not trained on) and its other numbers (JSON)."""
    return dataclasses.replace(
        trajectory,
        reward=result.score,
        reward_s=seconds,
        reward_error=result.error,
        reward_extra=json.dumps(result.extra) if result.extra else "",
        **fields,
    )


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
    scoring: int = 0
    """Trajectories finished and being scored (off the worker's loop)."""
    finished_under: int = -1
    """The newest version a trajectory of this sample finished under in this incarnation (-1:
    none yet): with dynamic sampling, a pause leaves a sample only being scored to finish
    after the sync unless it was being scored at the previous one already
    (``RolloutWorker._scored_before_pause``)."""
    trace: SampleTrace = field(default_factory=SampleTrace)

    def segments_of(self, index: int) -> tuple[list[int], list[int]]:
        return self.segments.setdefault(index, ([0], [self.version_start]))

    def trajectory(self, index: int, state: AgentState, t_end: float) -> Trajectory:
        """Trajectory ``index`` as generated so far, with its segments and their versions,
        not scored yet (``with_score``)."""
        starts, versions = self.segments_of(index)
        done = state.phase == Phase.TERMINATED
        while done and len(starts) > 1 and starts[-1] == len(state.response_ids):
            # Continued, it added no token (it had ended as the abort landed: a partial
            # logged by a worker before such a trajectory was finished at the abort): the
            # tokens are all the earlier version's, and so is the trajectory.
            starts.pop()
            versions.pop()
        return generated(
            state,
            finish_reason=state.finish_reason if done else "abort",
            param_version=versions[-1],
            param_version_start=versions[0],
            segment_starts=list(starts),
            segment_versions=list(versions),
            t_start=self.t_start,
            t_end=t_end,
        )

    def sample(self, sample_id: str, worker_id: int, trajectories: list[Trajectory]) -> Sample:
        p = self.prompt.value
        return Sample(
            sample_id=sample_id,
            prompt_id=p.prompt_id,
            worker_id=worker_id,
            prompt_ids=np.array(self.prompt_ids, np.int32),
            ground_truth=p.ground_truth,
            trajectories=trajectories,
        )

    def partial(
        self, sample_id: str, worker_id: int, n: int, version: int, now: float
    ) -> PartialSample:
        """The record ``partials`` keeps of this sample, cut short at ``version``: its finished
        trajectories, the interrupted ones' tokens so far and their agent states."""
        trajectories = [
            self.done[i] if i in self.done else self.trajectory(i, self.interrupted[i], now)
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
            s.prompt_ids.tolist(),
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
                    prompt_ids=s.prompt_ids.tolist(),
                    phase=Phase.GENERATING,
                    response_ids=t.response_ids.tolist(),
                    response_mask=t.response_mask.tolist(),
                    response_logprobs=t.response_logprobs.tolist(),
                )
        return fl


class Unscored(NamedTuple):
    """A finished trajectory whose reward is being computed (off the worker's loop)."""

    sample_id: str
    sample: InFlight
    """The sample it belongs to: if that sample was handed back meanwhile, the score is
    dropped, even if a sample of that id is in flight again."""
    traj_index: int
    trajectory: Trajectory
    """Built as it finished, with the versions of its segments then; the reward goes in."""
    span: Any
    """Its reward span, ended with the score (None: not traced)."""


class InFlightSamples:
    """Every sample this worker is generating, by sample id; trajectory ``i`` of sample ``s``
    runs on the agent runner as request ``s#i``."""

    def __init__(
        self, runner: AgentRunner, publisher: Sink, topic: Callable[[str], str], n: int
    ) -> None:
        self.runner = runner
        self.publisher = publisher
        self.samples_topic = topic("samples")
        self.partials_topic = topic("partials")
        self.n = n
        """Trajectories per sample (``rollout.n``)."""
        self.samples: dict[str, InFlight] = {}
        self.on_finished: Callable[[str, AgentState], None] | None = None
        """Set by the worker: scores a trajectory that ended (request id, state) into its
        sample's ``done`` (the scoring may finish later: ``wait_scored``), and publishes the
        sample if it was the last (``interrupt``)."""
        self.wait_scored: Callable[[], None] | None = None
        """Set by the worker: waits for every pending score, publishing the samples they
        complete (a hand-back that logs partials, after its ``interrupt``)."""

    def __len__(self) -> int:
        return len(self.samples)

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self.samples

    def __iter__(self) -> Iterator[str]:
        return iter(self.samples)

    def __getitem__(self, sample_id: str) -> InFlight:
        return self.samples[sample_id]

    def num_generating(self) -> int:
        """Samples with a trajectory still to finish, not those only waiting for rewards:
        what the concurrency limit (rollout.max_concurrent_samples) counts."""
        return sum(1 for fl in self.samples.values() if len(fl.done) + fl.scoring < self.n)

    def num_finished(self) -> int:
        """Samples whose trajectories have all finished decoding, only waiting for rewards:
        what a sync's pause leaves to be published after the weight transfer."""
        return len(self.samples) - self.num_generating()

    def pop(self, sample_id: str) -> InFlight:
        return self.samples.pop(sample_id)

    def start(self, rec: Record[PromptRecord], prompt_ids: list[int], version: int) -> InFlight:
        """A new sample: ``n`` trajectories of ``prompt_ids`` under ``version``."""
        p = rec.value
        fl = self.samples[p.sample_id] = InFlight(rec, prompt_ids, version, time.time())
        fl.trace.start(rec.topic, p.sample_id, rec.headers, rec.partition, rec.offset, version)
        fl.trace.start_segment(version)
        prompt, extra_info = p.chat() or p.prompt, p.reward_extra_info()
        for i in range(self.n):
            state = self.runner.start_state(prompt_ids, prompt, extra_info)
            self.runner.add(f"{p.sample_id}#{i}", state)
        return fl

    def resume_logged(self, rec: Record[PromptRecord], partial: PartialSample, version: int) -> int:
        """Continue a sample a previous incarnation logged to ``partials`` (crash recovery);
        returns how many of its trajectories are still to finish."""
        sample_id = partial.sample.sample_id
        fl = self.samples[sample_id] = InFlight.from_partial(rec, partial)
        fl.trace.start(rec.topic, sample_id, rec.headers, rec.partition, rec.offset, version, True)
        left = len(fl.interrupted)
        self._continue(sample_id, fl, version)
        return left

    def interrupt(self, sample_ids: set[str] | None = None) -> None:
        """Cut the trajectories of ``sample_ids`` (default: all) short before the next token;
        they wait in ``InFlight.interrupted`` to be logged, continued or dropped. One the
        abort found ended (EOS, a stop token, the length limit on its last token) is
        finished instead, under the version that generated it: scored into ``done``
        (``on_finished``), and its sample published if it was the last. So afterwards every
        trajectory of these samples is done or interrupted, and a sample they completed has
        left ``samples``."""
        ids = (
            None if sample_ids is None else {f"{s}#{i}" for s in sample_ids for i in range(self.n)}
        )
        for request_id, state in self.runner.interrupt(ids).items():
            sample_id, _, index = request_id.rpartition("#")
            self.samples[sample_id].interrupted[int(index)] = state
        for request_id, state in self.runner.take_finished():
            assert self.on_finished is not None, "the worker sets on_finished"
            self.on_finished(request_id, state)

    def log_partials(self, sample_ids: list[str], worker_id: int, version: int) -> int:
        """Publish each of ``sample_ids`` that has interrupted trajectories to ``partials`` and
        wait for the broker's acknowledgement, so the log holds them before the worker goes on;
        returns how many were logged."""
        now = time.time()
        logged = 0
        for sample_id in sample_ids:
            fl = self.samples[sample_id]
            if not fl.interrupted:
                continue
            fl.trace.end_segment(interrupted=True)
            record = fl.partial(sample_id, worker_id, self.n, version, now)
            with fl.trace.current():
                self.publisher.publish(
                    self.partials_topic,
                    sample_id,
                    encode_partial(record),
                    headers={SCHEMA_HEADER: PARTIAL_TAG},
                )
            logged += 1
        self.publisher.flush()
        return logged

    def publish(
        self,
        sample_id: str,
        worker_id: int,
        on_acked: Callable[[], None],
        filters: FilterGroupsConfig | None = None,
    ) -> bool:
        """Publish a sample whose trajectories are all done; ``on_acked`` runs once the broker
        has it (the prompt's offset may be committed only then). With ``filters`` (the run's
        dynamic sampling), True if the trainer will leave the group out: it is published with
        ``NO_SIGNAL_HEADER``, and its budget slot is the worker's again."""
        fl = self.samples.pop(sample_id)
        sample = fl.sample(sample_id, worker_id, [fl.done[i] for i in range(self.n)])
        fl.trace.end_segment(tokens=sum(len(t.response_ids) for t in sample.trajectories))
        headers = {SCHEMA_HEADER: SAMPLE_TAG, WORKER_HEADER: str(worker_id)}
        flat = filters is not None and no_signal(sample, filters) is not None
        if flat:
            headers[NO_SIGNAL_HEADER] = "1"
        with fl.trace.current():
            self.publisher.publish(
                self.samples_topic,
                sample_id,
                encode_sample(sample),
                headers=headers,
                # Not flushing here keeps the decode loop from stalling a broker round trip
                # per sample.
                on_acked=on_acked,
            )
        fl.trace.end()
        return flat

    def hand_back(self, partitions: set[int], log_as: tuple[int, int] | None) -> tuple[int, int]:
        """Stop generating the samples of prompt ``partitions`` (they move to another worker)
        and forget them; ``log_as`` (worker id, version): log their partials first. Returns
        (samples handed back, partials logged)."""
        moving = [s for s, fl in self.samples.items() if fl.prompt.partition in partitions]
        if not moving:
            return 0, 0
        self.interrupt(set(moving))
        if log_as is not None and self.wait_scored is not None:
            self.wait_scored()  # what the abort found ended: scored, so each logged sample's
            # trajectories are all done or interrupted (a sample it completed is published)
        moving = [s for s in moving if s in self.samples]  # not those it completed: published
        logged = self.log_partials(moving, *log_as) if log_as is not None else 0
        for sample_id in moving:
            self.samples.pop(sample_id).trace.end("its prompt partition moved to another worker")
        return len(moving), logged

    def continue_all(self, version: int) -> None:
        """Re-add every interrupted trajectory, continuing its prefix under ``version``."""
        for sample_id, fl in self.samples.items():
            self._continue(sample_id, fl, version)

    def _continue(self, sample_id: str, fl: InFlight, version: int) -> None:
        """Re-add one sample's interrupted trajectories; each starts a segment under ``version``
        (if its last segment got no token, that segment moves to ``version``; if it was cut
        under ``version`` itself, its tokens go on in the same segment: a sample handed back
        or logged at a stop, and continued before the next sync)."""
        if fl.interrupted:
            fl.trace.start_segment(version)
        for i, state in sorted(fl.interrupted.items()):
            starts, versions = fl.segments_of(i)
            if starts[-1] == len(state.response_ids):
                versions[-1] = version
            elif versions[-1] != version:
                starts.append(len(state.response_ids))
                versions.append(version)
            self.runner.add(f"{sample_id}#{i}", state)  # resumes from its phase
        fl.interrupted.clear()
