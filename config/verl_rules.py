"""The kinds of rule ``verl_keys`` gives a verl key (alias, ignored, fixed, refused) and the unit
conversions aliases use."""

from __future__ import annotations

import math
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


UNSET = object()
"""What a converting alias returns for verl's null: it sets nothing, and asyncrl's key keeps
the value it has (the user's, else the default)."""


def _whole(value: Any, least: int | None = None) -> int:
    """A count as verl's YAML or an override gives it: a whole number. A boolean, a fraction
    or text is refused (``int()`` would read ``true`` as 1 and ``2.5`` as 2), and so is a count
    below ``least``."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float | str):  # YAML 1.1 reads 2e5 as text
        try:
            as_float = float(value)
        except ValueError:
            as_float = math.nan
        number = int(as_float) if as_float.is_integer() else None
    if number is None:
        raise ValueError(f"a whole number is needed, not {_show(value)}")
    if least is not None and number < least:
        raise ValueError(f"a count of at least {least} is needed, not {number}")
    return number


def _required_samples(get: Get) -> int:
    return int(get("actor_rollout_ref.actor.ppo_mini_batch_size")) * int(
        get("async_training.require_batches")
    )


def _total_steps(_value: Any, get: Get) -> Any:
    """verl's fully async run ends after ``rollout.total_rollout_steps`` samples (prompts), or
    earlier after ``total_epochs`` passes over the data; asyncrl's after that many samples'
    worth of steps, each of ``ppo_mini_batch_size x require_batches`` samples. Each is a count
    of at least 1 (0 or -5 ran one step); null is no cap, and with no cap at all
    trainer.total_training_steps keeps its value (``UNSET``)."""
    caps = []
    if (samples := get("rollout.total_rollout_steps")) is not None:
        caps.append(_whole(samples, least=1))
    for key in ("rollout.total_epochs", "trainer.total_epochs"):
        if (epochs := get(key)) is not None:
            caps.append(_whole(epochs, least=1) * _epoch_size(get))
    if not caps:
        return UNSET
    return max(1, min(caps) // _required_samples(get))


def _epoch_size(get: Get) -> int:
    """Prompts in one epoch: the rows of data.train_files (their parquet footers; the ones
    over data.max_prompt_length are not known here, so counted too), else data.train_size."""
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


def _versions_to_steps(value: Any, get: Get) -> Any:
    """verl's fully async validates every ``rollout.test_freq`` weight versions; a version is
    ``trigger_parameter_sync_step`` steps. verl's -1 (never) is asyncrl's 0 (only at the end);
    null sets nothing (``UNSET``)."""
    if value is None:
        return UNSET
    versions = _whole(value)
    if versions <= 0:
        return 0
    return versions * int(get("async_training.trigger_parameter_sync_step"))


def _local_dir(value: Any, get: Get) -> Any:
    """verl's trainer.default_local_dir (checkpoints/<project>/<experiment>) as asyncrl's
    output_dir: its parent where its last part is the run_id (the run is then that very
    directory), else itself (the run is run_id under it)."""
    if value is None:
        return get("output_dir")
    from pathlib import PurePath

    path = PurePath(str(value))
    return str(path.parent) if path.name == get("run_id") else str(path)
