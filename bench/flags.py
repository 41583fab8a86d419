"""The flags several benchmarks take, and the checks of their values, made before any run starts
so a slip does not surface after a baseline ran for minutes. A value no run could take is a
:class:`FlagError`: one line naming the flag and the value (``asyncrl bench`` exits 2).
Torch is imported only to check ``--device cuda``."""

from __future__ import annotations

import argparse
import re
from typing import Any


class FlagError(ValueError):
    """A flag's value no run could take; the message names the flag and the value."""


def add_seeds(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--seeds",
        type=int,
        help="run every setup with this many trainer.seed values (from the config's, one more "
        "each) and compare medians (default 1)",
    )


def add_staleness(p: argparse.ArgumentParser, what: str) -> None:
    """``--staleness``: comma-separated staleness_threshold values; ``what`` they set."""
    p.add_argument(
        "--staleness", help=f"comma-separated async_training.staleness_threshold values: {what}"
    )


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", help="cpu, cuda, cuda:N (default: auto, a GPU when there is one)")


def seeds(args: argparse.Namespace) -> int:
    """``--seeds``, 1 unless given."""
    return 1 if args.seeds is None else at_least_one("--seeds", args.seeds)


def at_least_one(flag: str, value: int) -> int:
    if value < 1:
        raise FlagError(f"{flag} must be at least 1 (got {value})")
    return value


def comma_list(
    flag: str, text: str | None, kind: type, low: float, what: str, example: str
) -> tuple[Any, ...] | None:
    """``text``, a comma-separated list of ``kind`` values each at least ``low``, parsed (None
    when the flag is not given); ``what`` and ``example`` say what it takes when it is wrong."""
    if text is None:
        return None
    values = []
    for part in text.split(","):
        try:
            value = kind(part)
        except ValueError:
            value = None
        if value is None or not low <= value < float("inf"):
            raise FlagError(
                f"{flag} takes comma-separated {what} of at least {low:g} (e.g. {example}), "
                f"not {part.strip()!r}"
            )
        values.append(value)
    return tuple(values)


def staleness(args: argparse.Namespace) -> tuple[float, ...] | None:
    """``--staleness``'s values, or None when not given."""
    return comma_list("--staleness", args.staleness, float, 0, "numbers", "0.5,1,2")


def device(args: argparse.Namespace) -> str:
    """``--device`` (``auto`` unless given), refused where torch would refuse it deep in the
    benchmark: a name it does not know, or CUDA where torch sees none (or fewer devices than
    the index)."""
    given = args.device
    if given is None:
        return "auto"
    match = re.fullmatch(r"auto|cpu|cuda(?::(\d+))?", given)
    if match is None:
        raise FlagError(f"--device takes auto, cpu, cuda or cuda:N, not {given!r}")
    if given.startswith("cuda"):
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(match.group(1) or 0) >= count:
            raise FlagError(f"--device {given}: torch sees {count} CUDA device(s) here")
    return given
