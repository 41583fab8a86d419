"""The kinds of rule ``verl_keys`` gives a verl key (alias, ignored, fixed, refused) and the unit
conversions aliases use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Get = Callable[[str], Any]
"""The value a key ends up with (what the user set, else asyncrl's default)."""


class Refused(ValueError):
    """A value asyncrl cannot honour; the message says why."""


@dataclass(frozen=True)
class VerlKey:
    kind: str
    """alias, ignored, fixed or refused."""
    why: str
    """Shown in the docs, in warnings (ignored) and errors (refused)."""
    target: str | None = None
    """alias: asyncrl's key."""
    convert: Callable[[Any, Get], Any] | None = None
    """alias: verl's value -> asyncrl's (None: the same value)."""
    ok: Callable[[Any, Get], bool] | None = None
    """fixed: whether the value is what asyncrl does."""
    ok_text: str = ""
    """fixed: the values accepted, in words."""


def alias(target: str, why: str = "", convert: Callable[[Any, Get], Any] | None = None) -> VerlKey:
    return VerlKey("alias", why or "verl's name of the same setting", target, convert)


def ignored(why: str) -> VerlKey:
    return VerlKey("ignored", why)


def refused(why: str) -> VerlKey:
    return VerlKey("refused", why)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return a == b


def fixed(why: str, *values: Any) -> VerlKey:
    """asyncrl always does what ``values`` mean in verl."""
    text = " or ".join(_show(v) for v in values)
    return VerlKey(
        "fixed", why, ok=lambda v, _get: any(_same(v, ok) for ok in values), ok_text=text
    )


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _required_samples(get: Get) -> int:
    return int(get("actor_rollout_ref.actor.ppo_mini_batch_size")) * int(
        get("async_training.require_batches")
    )


def _total_steps(_value: Any, get: Get) -> int:
    """verl's fully async run ends after ``rollout.total_rollout_steps`` samples (prompts), or
    earlier after ``total_epochs`` passes over the data; asyncrl's after that many samples'
    worth of steps, each of ``ppo_mini_batch_size x require_batches`` samples."""
    caps = []
    if (samples := get("rollout.total_rollout_steps")) is not None:
        caps.append(int(samples))
    for key in ("rollout.total_epochs", "trainer.total_epochs"):
        if (epochs := get(key)) is not None:
            caps.append(int(epochs) * _epoch_size(get))
    return max(1, min(caps) // _required_samples(get))


def _epoch_size(get: Get) -> int:
    """Prompts in one epoch: the rows of data.train_files (their parquet footers; the ones
    over data.max_prompt_length are not known here, so counted too), else data.train_size.
    An epoch of your own files was data.train_size (2000, the built-in task's) prompts."""
    files = get("data.train_files")
    if not files:
        return int(get("data.train_size"))
    from pathlib import Path

    import pyarrow.parquet as pq

    from asyncrl.config.sections import file_paths

    try:
        return sum(pq.read_metadata(Path(str(p)).expanduser()).num_rows for p in file_paths(files))
    except (OSError, ValueError):  # not readable: the start-up checks name the file
        return int(get("data.train_size"))


def _versions_to_steps(value: Any, get: Get) -> int:
    """verl's fully async validates every ``rollout.test_freq`` weight versions; a version is
    ``trigger_parameter_sync_step`` steps. verl's -1 (never) is asyncrl's 0 (only at the end)."""
    if int(value) <= 0:
        return 0
    return int(value) * int(get("async_training.trigger_parameter_sync_step"))


def _local_dir(value: Any, get: Get) -> Any:
    """verl's trainer.default_local_dir (checkpoints/<project>/<experiment>) as asyncrl's
    output_dir: its parent where its last part is the run_id (the run is then that very
    directory), else itself (the run is run_id under it)."""
    if value is None:
        return get("output_dir")
    from pathlib import PurePath

    path = PurePath(str(value))
    return str(path.parent) if path.name == get("run_id") else str(path)
