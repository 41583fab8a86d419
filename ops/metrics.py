"""Metrics: verl's names (DESIGN.md section 5), a local JSONL file, and window clocks.

The idle ratios are computed over the whole sync window (from one sync to the next), not
only over the last pause, which is a known verl bug.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class JsonlWriter:
    """Appends one JSON object per line; flushed each write so a crash keeps what was logged."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, default=float) + "\n")

    def close(self) -> None:
        self._f.close()


class TensorBoardWriter:
    """Step metrics as TensorBoard scalars (``trainer.logger`` includes ``tensorboard``)."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise RuntimeError(
                f"trainer.logger includes tensorboard, but it is not installed ({err}): "
                "pip install 'asyncrl[tensorboard]'"
            ) from err
        self._w = SummaryWriter(log_dir=str(log_dir))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if isinstance(value, int | float):
                self._w.add_scalar(key, float(value), step)
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class WaitClock:
    """Accumulates the time spent waiting inside ``with clock.waiting():`` per window."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.window_start = clock()
        self.waited = 0.0

    def waiting(self) -> _Waiting:
        return _Waiting(self)

    def close_window(self) -> tuple[float, float]:
        """(idle ratio, window seconds) of the window that ends now; opens the next one."""
        now = self.clock()
        span = max(now - self.window_start, 1e-9)
        ratio = self.waited / span
        self.window_start, self.waited = now, 0.0
        return ratio, span


class _Waiting:
    def __init__(self, clock: WaitClock) -> None:
        self.clock = clock

    def __enter__(self) -> None:
        self._t0 = self.clock.clock()

    def __exit__(self, *exc: object) -> None:
        self.clock.waited += self.clock.clock() - self._t0
