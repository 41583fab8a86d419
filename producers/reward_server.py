"""The child process that runs a custom reward function (``python -m asyncrl.producers.reward_server
PATH NAME [KWARG_NAMES_JSON]``): it imports the file once, checks that the function takes every
call's arguments and the reward_kwargs, then answers one JSON line per call on stdout.

Protocol (JSON lines, no pickle): after loading, one line ``{"ok": true}`` or ``{"ok": false,
"key": <config key>, "error": ...}`` (then it exits). Each request ``{"kwargs": {...}}`` gets
``{"score": float, "extra": {name: float}}`` or ``{"error": "<type>: <message>"}``. What the
reward function prints goes to stderr (the worker's log), never into the protocol.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any

PATH_KEY = "custom_reward_function.path"
NAME_KEY = "custom_reward_function.name"


def load_function(path: str, name: str) -> Any:
    """The function ``name`` of the file ``path``; LookupError(key, why) if there is none."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise LookupError(PATH_KEY, f"{path}: no such file")
    spec = importlib.util.spec_from_file_location(f"custom_reward_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise LookupError(PATH_KEY, f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    # its own folder first on the path, as `python my_reward.py` has it: a sibling module
    # (`from my_utils import ...`) imports wherever the run was started from
    sys.path.insert(0, str(file.resolve().parent))
    try:
        spec.loader.exec_module(module)
    except BaseException as err:  # a syntax error, a failed import: the user's file is at fault
        frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == str(file)]
        line = f" (line {frames[-1].lineno})" if frames else ""
        raise LookupError(PATH_KEY, f"{path}: importing it failed{line}: {_why(err)}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = sorted(
            k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
        )
        raise LookupError(
            NAME_KEY,
            f"{path} has no function {name!r} (it defines: {', '.join(defined) or 'none'})",
        )
    return fn


KWARGS_KEY = "custom_reward_function.reward_kwargs"
ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""What every call passes, by name (verl's), before the reward_kwargs."""


def check_arguments(fn: Any, name: str, kwarg_names: list[str]) -> None:
    """LookupError(key, why) unless ``fn`` takes every call's arguments and the reward_kwargs,
    checked at start-up: an argument it does not take would fail every call, each trajectory
    a reward failure, and the run would train on nothing to its last step."""
    import inspect

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (a builtin): the calls will tell
        return
    try:
        signature.bind(**dict.fromkeys(ARGUMENTS), **dict.fromkeys(kwarg_names))
    except TypeError as err:
        extra = [k for k in kwarg_names if k not in signature.parameters]
        key = KWARGS_KEY if extra and f"'{extra[0]}'" in str(err) else NAME_KEY
        raise LookupError(
            key,
            f"{name}{signature} cannot be called with {', '.join(ARGUMENTS)}"
            + (f" and reward_kwargs {', '.join(kwarg_names)}" if kwarg_names else "")
            + f": {err}",
        ) from None


def _why(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def to_result(value: Any) -> dict[str, Any]:
    """A reward function's return value as the reply: a number, or a dict with "score" (its
    other numeric entries are kept as extra metrics). ValueError/TypeError if it is neither."""
    extra: dict[str, float] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"returned a dict without 'score' (keys: {sorted(value)})")
        for key, v in value.items():
            if key == "score" or isinstance(v, str | bytes):
                continue  # text is no metric, even when it reads as a number ("pred": "42")
            try:
                number = float(v)
            except (TypeError, ValueError):
                continue  # verl keeps any value; only numbers become metrics here
            if math.isfinite(number):
                extra[str(key)] = number
        value = value["score"]
    if isinstance(value, str):
        raise TypeError(f"returned a string ({value[:40]!r}), not a number")
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"returned {score}")
    return {"score": score, "extra": extra}


def serve(path: str, name: str, kwarg_names: list[str] | None = None) -> int:
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the function's prints go to the log
    sys.stdout = sys.stderr
    try:
        fn = load_function(path, name)
        check_arguments(fn, name, kwarg_names or [])
    except LookupError as err:
        key, why = err.args
        proto.write(json.dumps({"ok": False, "key": key, "error": why}) + "\n")
        return 1
    proto.write(json.dumps({"ok": True}) + "\n")
    for line in sys.stdin:
        try:
            kwargs = json.loads(line)["kwargs"]
            reply = to_result(fn(**kwargs))
        except Exception as err:
            reply = {"error": _why(err)}
        proto.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(
        serve(sys.argv[1], sys.argv[2], json.loads(sys.argv[3] if len(sys.argv) > 3 else "[]"))
    )
