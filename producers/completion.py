"""A rollout worker's output side: each finished trajectory scored (inline, or on the reward
pool off the loop), each sample published once all ``n`` of its trajectories are scored, and
the counts the budget needs (samples produced, groups dynamic sampling leaves out)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from asyncrl.producers.agent.state import AgentState
from asyncrl.producers.budget import RolloutBudget
from asyncrl.producers.in_flight import InFlight, InFlightSamples, Unscored, with_score
from asyncrl.producers.io import PromptFeed
from asyncrl.producers.scoring import TrajectoryScorer

__all__ = ["Completion"]


class Completion:
    """Scores finished trajectories and publishes whole samples, for one worker."""

    def __init__(
        self,
        worker_id: int,
        n: int,
        score: TrajectoryScorer,
        in_flight: InFlightSamples,
        budget: Callable[[], RolloutBudget],
        filters: Any,
    ) -> None:
        self.worker_id = worker_id
        self.n = n
        self.score = score
        self.in_flight = in_flight
        self.budget = budget
        """The current version's budget (a group with no signal refunds its slot there)."""
        self.filters = filters
        """Dynamic sampling (``cfg.filters_groups``), or None."""
        self.prompts: PromptFeed | None = None
        """The prompts feed: a sample's prompt is done once the broker has the sample."""
        self.produced = 0
        self.no_signal = 0
        """Of ``produced``, the groups dynamic sampling leaves out: their slots came back as
        they were published, so they are not stale at a sync."""

    def on_finished(self, request_id: str, state: AgentState) -> None:
        """Score a finished trajectory (inline, or submitted to the reward pool); its sample
        is published once all ``n`` are scored (``collect``)."""
        sample_id, _, index = request_id.rpartition("#")
        fl, i = self.in_flight[sample_id], int(index)
        # Built now: its segments' versions are those it finished under, whatever happens
        # (a sync, an in-flight swap) while it is scored.
        unscored = Unscored(
            sample_id,
            fl,
            i,
            fl.trajectory(i, state, time.time()),
            fl.trace.start_child("reward", **{"asyncrl.traj_index": i}),
        )
        fl.scoring += 1
        fl.finished_under = max(fl.finished_under, unscored.trajectory.param_version)
        self.score.submit(unscored, fl.prompt.value, state, request_id)
        self.collect()

    def collect(self, timeout: float = 0.0) -> None:
        """Take the scores computed by now (waiting up to ``timeout`` for one); publish each
        sample whose ``n`` trajectories are all scored."""
        for key, result, seconds in self.score.results(timeout):
            u: Unscored = key
            if u.span is not None:
                u.span.end()
            sample_id, fl = u.sample_id, u.sample
            fl.scoring -= 1
            if self.in_flight.samples.get(sample_id) is not fl:
                continue  # handed back (its partition lost) or dropped while it was scored
            fl.done[u.traj_index] = with_score(u.trajectory, result, seconds, t_end=time.time())
            if len(fl.done) == self.n:
                self.publish(sample_id, fl)

    def drain(
        self, keep_alive: bool = True, only: Callable[[InFlight], bool] | None = None
    ) -> None:
        """Wait for every pending score (each call is bounded by its timeout), or ``only`` for
        those of the samples it picks, and publish the samples they complete."""

        def waiting() -> bool:
            if only is None:
                return self.score.pending > 0
            return any(fl.scoring and only(fl) for fl in self.in_flight.samples.values())

        while waiting():
            self.collect(timeout=0.05)
            if keep_alive and self.prompts is not None:
                self.prompts.keep_alive()

    def publish(self, sample_id: str, fl: InFlight) -> None:
        assert self.prompts is not None
        # The prompt's offset may be committed only once the broker has the sample.
        acked = functools.partial(self.prompts.done, fl.prompt)
        flat = self.in_flight.publish(sample_id, self.worker_id, acked, self.filters)
        self.produced += 1
        if flat:
            # The trainer will leave this group out (no signal): its slot is ours again
            # now, not after the trainer has read it and said so on the control topic.
            self.no_signal += 1
            self.budget().refund(1)
