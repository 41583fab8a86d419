"""Which prompt a rollout worker starts next, and how, so that every prompt ends as one sample.

A prompt taken from the group is one of three things (the log tells which, read by
``recovery.RecoveryIndex``): already published (redelivered after a crash that lost only its
commit: committed, not generated again), logged as a partial (continued from its tokens), or
new (started, taking one unit of the version's budget). This worker's own logged partials
(``stale_partials``) go first, out of order, and take no budget: they were counted as stale
when the budget was opened.

Partitions move between workers (a rebalance): the old owner hands back what it generates
for them (``hand_back``), the new one re-reads the log before its next admission.
"""

from __future__ import annotations

import logging

from asyncrl.config import RunConfig
from asyncrl.kafka.records import LogScan
from asyncrl.producers.budget import RolloutBudget
from asyncrl.producers.in_flight import InFlightSamples
from asyncrl.producers.io import PromptFeed
from asyncrl.producers.recovery import RecoveryIndex

log = logging.getLogger(__name__)


class PromptAdmission:
    def __init__(
        self,
        cfg: RunConfig,
        worker_id: int,
        in_flight: InFlightSamples,
        tokenizer: object,
        scan_log: LogScan,
    ) -> None:
        self.cfg = cfg
        self.worker_id = worker_id
        self.in_flight = in_flight
        self.tokenizer = tokenizer
        self.scan_log = scan_log
        self.max_concurrent = cfg.actor_rollout_ref.rollout.max_concurrent_samples
        self.recovery = RecoveryIndex()
        self.stale_partials: set[str] = set()
        """This worker's partial samples, logged by its previous incarnation, not continued yet:
        counted as stale in its budget (num_stale), so continuing one takes no budget."""
        self.rescan = False
        """Set when the prompts group is rebalanced: re-read the log before the next admission."""

    def read_log(self) -> int:
        """At a (re)start: index the log; returns the samples this worker id published."""
        self.recovery = RecoveryIndex.from_log(self.scan_log)
        self.recovery.log_found(self.worker_id)
        self.stale_partials = {
            sid for sid, p in self.recovery.partials.items() if p.sample.worker_id == self.worker_id
        }
        return self.recovery.produced[self.worker_id]

    def num_stale_partials(self) -> int:
        """Logged partials of this worker's previous incarnation still to continue (others
        may have continued some)."""
        self.stale_partials &= set(self.recovery.partials)
        return len(self.stale_partials)

    def admit(self, prompts: PromptFeed, budget: RolloutBudget, version: int) -> bool:
        """Start one sample if the budget and the concurrency limit allow; True if one started
        (or a redelivered prompt was found published and committed)."""
        if (
            len(self.in_flight) >= self.max_concurrent
            and self.in_flight.num_generating() >= self.max_concurrent
        ):  # a sample whose trajectories are only being scored leaves the engine room
            prompts.keep_alive()
            return False
        rec = None
        if self.stale_partials:
            rec = prompts.take_where(lambda r: r.value.sample_id in self.stale_partials)
        if rec is None and budget.remaining == 0:
            prompts.keep_alive()
            return False
        if rec is None:
            rec = prompts.take(timeout=0.0 if self.in_flight else 0.05)
        if rec is None:
            return False
        p = rec.value
        if self.rescan:
            self.rescan = False
            self.recovery.rescan(self.scan_log)
        if self.recovery.already_published(p.sample_id):
            # Redelivered after a crash, but its sample is on the log: only the commit was lost.
            log.info(
                "worker %d: %s already published, not generated again", self.worker_id, p.sample_id
            )
            prompts.done(rec)
            self.stale_partials.discard(p.sample_id)
            return True
        if p.sample_id in self.stale_partials:
            self.stale_partials.discard(p.sample_id)  # counted as stale: no budget taken
        else:
            budget.take()
        partial = self.recovery.take_partial(p.sample_id)
        if partial is not None:
            left = self.in_flight.resume_logged(rec, partial, version)
            log.info(
                "worker %d: continuing %s from the partials log (%d of %d trajectories to finish)",
                *(self.worker_id, p.sample_id, left, self.cfg.actor_rollout_ref.rollout.n),
            )
            return True
        # chat messages through the chat template, with the tools' schemas; a built-in task's
        # text: <bos> + characters. The held-out evaluation encodes with the same method.
        prompt_ids = self.in_flight.runner.prompt_ids(
            p.chat() or p.prompt, self.cfg.data.max_prompt_length
        )
        self.in_flight.start(rec, prompt_ids, version)
        return True

    def on_assigned(self, partitions: set[int]) -> None:
        """Partitions may come from another worker (even the first ones of a worker added
        mid-run): some of their redelivered prompts may be published or logged as partials
        by it since this worker last read the log. Re-read it before the next admission."""
        self.rescan = True

    def hand_back(
        self, partitions: set[int], budget: RolloutBudget, log_as: tuple[int, int] | None
    ) -> None:
        """Partitions move to another worker, which gets their uncommitted prompts again: stop
        generating those, or they would be generated twice. ``log_as`` (worker id, version):
        log their partials first (mode d, partitions not lost yet), so the new owner continues
        rather than restarts them. The budget they took is refunded."""
        moved, logged = self.in_flight.hand_back(partitions, log_as)
        if moved:
            budget.refund(moved)
            log.info(
                "worker %d: handed %d samples in flight back to the group (%d logged as partials)",
                *(self.worker_id, moved, logged),
            )

    def summary(self) -> str:
        return (
            f"{self.recovery.skipped} redelivered prompts were already published, "
            f"{self.recovery.resumed} logged partial samples continued"
        )
