"""Metrics: verl's names (docs/observability.md, "Metrics"), a local JSONL file, and window clocks.

Names and meanings follow verl (docs/observability.md lists each with the verl file it comes
from); :func:`timing_metrics` and :func:`throughput_metrics` are verl's
``compute_timing_metrics`` and ``compute_throughout_metrics`` (verl/trainer/ppo/metric_utils.py)
on token counts. The idle ratios are computed over the whole sync window (from one sync to
the next), not only over the last pause, which is a known verl bug.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PER_TOKEN_STAGES = ("ref", "values", "adv", "update_critic", "update_actor")


def timing_metrics(
    timing_raw: dict[str, float], prompt_tokens: int, response_tokens: int
) -> dict[str, float]:
    """``timing_s/<name>``: seconds of each timed stage of a step; ``timing_per_token_ms/gen``
    per response token, ``timing_per_token_ms/<update stage>`` per prompt + response token."""
    tokens = {
        "gen": response_tokens,
        **dict.fromkeys(_PER_TOKEN_STAGES, prompt_tokens + response_tokens),
    }
    out = {f"timing_s/{name}": float(s) for name, s in timing_raw.items()}
    for name in timing_raw.keys() & tokens.keys():
        if tokens[name]:
            out[f"timing_per_token_ms/{name}"] = timing_raw[name] * 1000 / tokens[name]
    return out


def throughput_metrics(total_num_tokens: int, step_s: float, n_devices: int) -> dict[str, float]:
    """``perf/total_num_tokens``: prompt + response tokens of the step's batch (every
    trajectory); ``perf/time_per_step``: the step's seconds; ``perf/throughput``: tokens per
    second per device, ``total_num_tokens / (time_per_step * n_devices)``."""
    return {
        "perf/total_num_tokens": float(total_num_tokens),
        "perf/time_per_step": step_s,
        "perf/throughput": total_num_tokens / (max(step_s, 1e-9) * max(n_devices, 1)),
    }


STALENESS_PREFIX = "fully_async/staleness/count_"


def stale_in_step(metrics: dict[str, Any]) -> int:
    """Samples of one step's row trained at least one version behind (asyncrl's per-step
    ``fully_async/staleness/count_<k>``, k >= 1; verl's ``fully_async/count/stale_*`` are
    running totals)."""
    return int(
        sum(
            v
            for k, v in metrics.items()
            if k.startswith(STALENESS_PREFIX) and int(k.removeprefix(STALENESS_PREFIX)) > 0
        )
    )


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


class LevelClock:
    """The time-weighted mean of a level per window: ``set(level)`` where the level changes
    (how full a rollout worker's engine is). The level set last holds until the next ``set``,
    across a window's end: each window counts its part."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.window_start = clock()
        self._level = 0.0
        self._since = self.window_start
        self._area = 0.0

    def set(self, level: float) -> None:
        now = self.clock()
        self._area += self._level * (now - self._since)
        self._level, self._since = level, now

    def close_window(self) -> tuple[float, float]:
        """(mean level, window seconds) of the window that ends now; opens the next one."""
        now = self.clock()
        span = max(now - self.window_start, 1e-9)
        area = self._area + self._level * (now - self._since)
        self.window_start = self._since = now
        self._area = 0.0
        return area / span, span


class WaitClock(LevelClock):
    """Time spent waiting, per window (idle ratios): ``with clock.waiting():`` around a wait
    (the trainer), or ``set_waiting(flag)`` where waiting starts and ends in different places
    (a rollout worker, idle between decoding steps). ``close_window`` gives the idle ratio; a
    wait still open when a window closes counts in both windows, each its part."""

    def set_waiting(self, waiting: bool) -> None:
        self.set(1.0 if waiting else 0.0)

    def waiting(self) -> _Waiting:
        return _Waiting(self)


class _Waiting:
    def __init__(self, clock: WaitClock) -> None:
        self.clock = clock

    def __enter__(self) -> None:
        self.clock.set_waiting(True)

    def __exit__(self, *exc: object) -> None:
        self.clock.set_waiting(False)
