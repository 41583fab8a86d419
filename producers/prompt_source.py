"""Prompts from the ``prompts`` topic for one rollout worker, as a member of the workers' group.

Why the pausing: the group's ``max.poll.interval.ms`` is also its rebalance timeout, kept
small so Tansu's join takes ~3 s. A worker whose budget is spent must keep polling to stay in
the group, so it pauses its partitions and goes on polling instead of stopping.

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
    def __init__(self, cfg: RunConfig, bootstrap: str, dead_letter=None) -> None:
        self.topic = cfg.topic("prompts")
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
        """Poll without taking anything (partitions paused): keeps the group membership."""
        if not self.paused or self._assigned:
            self.paused = True
            self._assigned = False
            self.reader.pause_all()
        self._buffer.extend(self.reader.poll(0.0))

    def take(self, timeout: float) -> Record[PromptRecord] | None:
        """The next prompt, or None if none arrived within ``timeout`` seconds."""
        self.resume()
        if not self._buffer:
            self._buffer.extend(self.reader.poll(timeout, max_records=16))
        if not self._buffer:
            return None
        rec = self._buffer.pop(0)
        self._open.setdefault(rec.partition, set()).add(rec.offset)
        self._next_commit[rec.partition] = max(
            self._next_commit.get(rec.partition, 0), rec.offset + 1
        )
        return rec

    def done(self, rec: Record[PromptRecord]) -> None:
        """The sample for ``rec`` is acknowledged: commit as far as nothing earlier is open."""
        self._open[rec.partition].discard(rec.offset)
        self.commit()

    def commit(self) -> None:
        offsets = {}
        for partition, high in self._next_commit.items():
            open_offsets = self._open.get(partition)
            offsets[(self.topic, partition)] = min(open_offsets) if open_offsets else high
        if offsets:
            self.reader.commit(offsets)

    @property
    def in_progress(self) -> int:
        return sum(len(s) for s in self._open.values())

    def close(self) -> None:
        self.reader.close()
