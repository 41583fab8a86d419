"""The synthetic tasks shipped with the project, chosen by ``data.task``."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from asyncrl.tasks.arithmetic import Problem


def module(task: str) -> ModuleType:
    """The module of a shipped task (``data.task``, validated at load): its ``make_splits``,
    its warm start's teacher and its model's ``POSITIONS``."""
    return importlib.import_module(f"asyncrl.tasks.{task}")


def splits(data_cfg: Any) -> tuple[list[Problem], list[Problem]]:
    """(train, val) problems of ``data_cfg.task``, the same in every process."""
    return module(data_cfg.task).make_splits(data_cfg)


def score(task: str, answer: str, messages: list[dict[str, str]]) -> float:
    """The reward of one trajectory: 1.0 iff its final answer is ``answer`` (arithmetic's
    rule serves the countdown too: the whole chain is its answer)."""
    if task == "calculator":
        from asyncrl.tasks import calculator

        return calculator.score(answer, messages)
    from asyncrl.tasks import arithmetic

    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    return arithmetic.score(answer, turns[-1] if turns else "")
