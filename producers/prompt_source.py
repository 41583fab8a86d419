"""Prompts from the ``prompts`` topic for one rollout worker, as a member of the workers' group.

Why the pausing: the group's ``max.poll.interval.ms`` is also its rebalance timeout, kept
small so Tansu's join takes ~3 s. A worker that is not taking prompts (budget spent, or all
slots busy) must keep polling to stay in the group. It tops up a local buffer of
``prefetch`` prompts and pauses its partitions only once the buffer is full. Pausing is not
free: librdkafka drops its fetched queue on pause, and on Tansu the first records after a
resume took 0.4-1 s to arrive. Pausing at every busy moment (the first version did) starved
the worker of prompts for ~40% of its time; the default buffer holds two versions' budget, so
the refetch after a resume overlaps with work on buffered prompts.

Offsets are committed only up to the first prompt not yet turned into a published sample
(``done`` must be called after the sample is acknowledged by the broker), so a crash loses
no prompt: at worst one is generated twice.
"""

from __future__ import annotations

import logging

from asyncrl.ops.config import RunConfig
from asyncrl.ops.kafka import Reader, Record
from asyncrl.schemas.prompt import PromptRecord, decode_prompt

log = logging.getLogger(__name__)


class PromptSource:
    def __init__(
        self, cfg: RunConfig, bootstrap: str, dead_letter=None, prefetch: int | None = None
    ) -> None:
        self.topic = cfg.topic("prompts")
        self.prefetch = prefetch or (
            2 * cfg.max_samples_per_version + cfg.actor_rollout_ref.rollout.max_concurrent_samples
        )
        self.reader: Reader[PromptRecord] = Reader(
            cfg.kafka,
            bootstrap,
            decode_prompt,
            group_id=f"{cfg.run_id}.rollout",
            dead_letter=dead_letter,
        )
        self.paused = False
        self._assigned = False
        self._buffer: list[Record[PromptRecord]] = []
        self._open: dict[int, set[int]] = {}  # partition -> offsets taken, not yet done
        self._next_commit: dict[int, int] = {}  # partition -> highest offset taken + 1
        self.reader.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    # --- group membership -------------------------------------------------------------------
    def _on_assign(self, partitions: list[tuple[str, int]]) -> None:
        self._assigned = True  # new partitions start unpaused: keep_alive pauses them again

    def _on_revoke(self, partitions: list[tuple[str, int]]) -> None:
        lost = {p for _topic, p in partitions}
        self._buffer = [r for r in self._buffer if r.partition not in lost]

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self.reader.pause_all()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.reader.resume_all()

    # --- taking prompts -----------------------------------------------------------------------
    def keep_alive(self) -> None:
        """Poll without taking anything: keeps the group membership, tops up the buffer."""
        room = self.prefetch - len(self._buffer)
        if room <= 0:
            if not self.paused or self._assigned:
                self.paused = True
                self._assigned = False
                self.reader.pause_all()
            self._buffer.extend(self.reader.poll(0.0))
        else:
            self.resume()
            self._buffer.extend(self.reader.poll(0.0, max_records=room))

    def take(self, timeout: float) -> Record[PromptRecord] | None:
        """The next prompt, or None if none arrived within ``timeout`` seconds."""
        if not self._buffer:
            self.resume()
            self._buffer.extend(self.reader.poll(timeout, max_records=self.prefetch))
        if not self._buffer:
            return None
        rec = self._buffer.pop(0)
        self._open.setdefault(rec.partition, set()).add(rec.offset)
        self._next_commit[rec.partition] = max(
            self._next_commit.get(rec.partition, 0), rec.offset + 1
        )
        return rec

    def done(self, rec: Record[PromptRecord]) -> None:
        """The sample for ``rec`` is acknowledged: commit as far as nothing earlier is open.

        Asynchronously: a commit lost in a crash only means a prompt is redelivered, and the
        restarted worker finds its sample on the log (see ``recovery``). ``close`` commits
        synchronously.
        """
        self._open[rec.partition].discard(rec.offset)
        self.commit(asynchronous=True)

    def commit(self, asynchronous: bool = False) -> None:
        offsets = {}
        for partition, high in self._next_commit.items():
            open_offsets = self._open.get(partition)
            offsets[(self.topic, partition)] = min(open_offsets) if open_offsets else high
        if offsets:
            self.reader.commit(offsets, asynchronous=asynchronous)

    @property
    def in_progress(self) -> int:
        return sum(len(s) for s in self._open.values())

    def close(self) -> None:
        self.commit()
        self.reader.close()
