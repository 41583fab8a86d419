"""The synthetic tasks shipped with the project, chosen by ``data.task``."""

from __future__ import annotations

from typing import Any

from asyncrl.tasks.arithmetic import Problem


def splits(data_cfg: Any) -> tuple[list[Problem], list[Problem]]:
    """(train, val) problems of ``data_cfg.task``, the same in every process."""
    if data_cfg.task == "calculator":
        from asyncrl.tasks import calculator

        return calculator.make_splits(data_cfg)
    if data_cfg.task == "countdown":
        from asyncrl.tasks import countdown

        return countdown.make_splits(data_cfg)
    from asyncrl.tasks import arithmetic

    return arithmetic.make_splits(data_cfg)


def score(task: str, answer: str, messages: list[dict[str, str]]) -> float:
    """The reward of one trajectory: 1.0 iff its final answer is ``answer`` (arithmetic's
    rule serves the countdown too: the whole chain is its answer)."""
    if task == "calculator":
        from asyncrl.tasks import calculator

        return calculator.score(answer, messages)
    from asyncrl.tasks import arithmetic

    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    return arithmetic.score(answer, turns[-1] if turns else "")
