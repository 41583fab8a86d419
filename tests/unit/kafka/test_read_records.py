"""read_records on a long topic: its timeout is for a stalled read, not for the whole read."""

import pytest

from asyncrl.config import load_config
from asyncrl.kafka import records
from asyncrl.kafka.record import Record


class _Clock:
    """Each read of the clock is ``step`` seconds later: a slow, steady read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class _SlowReader:
    """One record per poll, from a partition holding ``n``; nothing once ``stall_at`` is read."""

    def __init__(self, n: int, stall_at: int | None = None) -> None:
        self.n, self.stall_at, self.next = n, stall_at, 0

    def __call__(self, *_a, **_kw) -> "_SlowReader":
        return self

    def __enter__(self) -> "_SlowReader":
        return self

    def __exit__(self, *_exc) -> None:
        return None

    def watermarks(self, _topic: str) -> dict[int, tuple[int, int]]:
        return {0: (0, self.n)}

    def assign(self, _topic: str, _starts: dict[int, int]) -> None:
        return None

    def poll(self, _timeout: float) -> list[Record[bytes]]:
        if self.next == self.stall_at:
            return []
        self.next += 1
        return [Record("t", 0, self.next - 1, None, 0, {}, b"")]


def test_a_long_read_that_keeps_going_does_not_time_out(monkeypatch):
    """Resuming the soak run read its 1.6M prompts (the feed's idempotence check) for more
    than the 30 s the whole read was allowed, and the run could not be resumed."""
    cfg = load_config(None, [])
    monkeypatch.setattr(records.time, "monotonic", _Clock(step=1.0))
    monkeypatch.setattr(records, "Reader", _SlowReader(100))
    got = list(records.read_records(cfg, "b:9092", "prompts", timeout_s=5.0))
    assert [r.offset for r in got] == list(range(100))


def test_a_stalled_read_still_times_out(monkeypatch):
    cfg = load_config(None, [])
    monkeypatch.setattr(records.time, "monotonic", _Clock(step=1.0))
    monkeypatch.setattr(records, "Reader", _SlowReader(100, stall_at=40))
    with pytest.raises(TimeoutError, match="no record for 5 s"):
        list(records.read_records(cfg, "b:9092", "prompts", timeout_s=5.0))
