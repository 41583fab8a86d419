"""The sample ids a trainer has settled (trained on or dropped), kept exactly in memory that
grows with the dataset, not with the run.

A sample id is ``<prompt id>@<epoch>`` (``PromptRecord.sample_id``), and the feed writes the
same prompts epoch after epoch. So per prompt id one number says which epochs are settled,
a watermark: every epoch below it. The epochs settled out of order above it (a sample of
epoch e+1 trained before the one of epoch e, which a partial rollout or a slow worker still
holds) are kept beside it until the watermark reaches them. An id of any other form (a
sample replayed in from elsewhere) is kept as it is.

Before, every id was a key of a dict with its partition and offset: ~200 bytes per sample,
for the whole run (~1.6 KB a step of the demo's 8 samples; the checkpoint wrote them all at
every save). Here a 2,000-prompt dataset costs ~150 KB after its first epoch and nothing more,
and no id is forgotten: a copy that arrives however late is still a duplicate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def split_sample_id(sample_id: str) -> tuple[str, int] | None:
    """``(prompt id, epoch)`` of ``<prompt id>@<epoch>``; None for an id of another form."""
    prompt, at, epoch = sample_id.rpartition("@")
    if not at or not epoch.isdigit() or (len(epoch) > 1 and epoch[0] == "0"):
        return None  # "x@01" is not x's epoch 1: it would come back as "x@1"
    return prompt, int(epoch)


class SettledIds:
    def __init__(self) -> None:
        self.below: dict[str, int] = {}
        """Prompt id -> the first epoch not settled (every epoch below it is)."""
        self.ahead: dict[str, set[int]] = {}
        """Prompt id -> epochs settled above its watermark (out of order)."""
        self.other: set[str] = set()
        """Ids not of the form ``<prompt id>@<epoch>``."""

    def add(self, sample_id: str) -> None:
        parts = split_sample_id(sample_id)
        if parts is None:
            self.other.add(sample_id)
            return
        prompt, epoch = parts
        mark = self.below.get(prompt, 0)
        if epoch < mark:
            return
        if epoch > mark:
            self.ahead.setdefault(prompt, set()).add(epoch)
            return
        mark += 1
        later = self.ahead.get(prompt)
        while later and mark in later:
            later.discard(mark)
            mark += 1
        if later is not None and not later:
            del self.ahead[prompt]
        self.below[prompt] = mark

    def __contains__(self, sample_id: object) -> bool:
        if not isinstance(sample_id, str):
            return False
        parts = split_sample_id(sample_id)
        if parts is None:
            return sample_id in self.other
        prompt, epoch = parts
        return epoch < self.below.get(prompt, 0) or epoch in self.ahead.get(prompt, ())

    def __len__(self) -> int:
        """How many ids are settled."""
        return sum(self.below.values()) + sum(map(len, self.ahead.values())) + len(self.other)

    def entries(self) -> int:
        """How many numbers and ids it holds: what its memory grows with."""
        return len(self.below) + sum(map(len, self.ahead.values())) + len(self.other)

    def state(self) -> dict[str, Any]:
        """For the checkpoint (JSON)."""
        return {
            "below": dict(self.below),
            "ahead": {p: sorted(e) for p, e in self.ahead.items()},
            "other": sorted(self.other),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SettledIds:
        ids = cls()
        ids.below = {str(p): int(e) for p, e in state.get("below", {}).items()}
        ids.ahead = {str(p): {int(x) for x in e} for p, e in state.get("ahead", {}).items() if e}
        ids.other = {str(s) for s in state.get("other", [])}
        return ids

    @classmethod
    def of(cls, sample_ids: Iterable[str]) -> SettledIds:
        ids = cls()
        for sample_id in sample_ids:
            ids.add(sample_id)
        return ids
