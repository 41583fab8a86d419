"""A task that needs the calculator tool: ``347*86=``, three digits times two.

A ~100k-parameter model cannot multiply in its head, but it can learn to copy: write the
call ``[347*86]`` (the operands sit at fixed positions in the prompt), read the tool's
response ``=29842 `` and copy the digits as its answer. One trajectory, in the compact
tool-call format (see ``producers/agent/parser.py``)::

    prompt <bos>347*86=   model [347*86]   tool =29842␠   model 29842<eos>
                          mask  11111111        0000000         111111

The warm start imitates a teacher who uses the calculator only sometimes
(``multi_turn.warmup_tool_prob``) and otherwise guesses (the product rounded to the
thousand: the right shape, rarely the right number). The warm policy therefore calls the
tool in only some samples; those are the ones rewarded, and RL raises the tool-use rate
and the accuracy together. A 4-digit product (18% of the problems) puts its digits one
position nearer the answer than a 5-digit one, so the teacher's calls must include enough of
them for the warm start to learn that copy too (the shipped config's ``warmup_steps`` and
``warmup_tool_prob``); a prompt the warm policy never answers right gives RL nothing to learn.
"""

from __future__ import annotations

import random
from typing import Protocol

from asyncrl.tasks.arithmetic import EOS_TEXT, Problem, parse_response

TOOL_CHARS = "[]?"
"""Characters the tool task adds to the demo tokenizer: call brackets and the error mark."""
POSITIONS = 64
"""Positions of the task's model (a prompt and its trajectory take ~40)."""


class _DataCfg(Protocol):
    """The fields of ``asyncrl.config.DataConfig`` this module reads."""

    seed: int
    train_size: int
    val_size: int


def make_problem(a: int, b: int) -> Problem:
    return Problem(prompt_id=f"mul-{a}-{b}", prompt=f"{a}*{b}=", answer=str(a * b))


def make_splits(data_cfg: _DataCfg) -> tuple[list[Problem], list[Problem]]:
    """Disjoint (train, val) splits of ``a*b=`` with 100 <= a <= 999 and 10 <= b <= 99."""
    total = 900 * 90
    if data_cfg.train_size + data_cfg.val_size > total:
        raise ValueError(f"train_size + val_size is larger than the {total} problems")
    rng = random.Random(data_cfg.seed)
    picks = rng.sample(range(total), data_cfg.train_size + data_cfg.val_size)
    problems = [make_problem(100 + i // 90, 10 + i % 90) for i in picks]
    return problems[data_cfg.val_size :], problems[: data_cfg.val_size]


def operands(problem: Problem) -> tuple[int, int]:
    a, b = problem.prompt.rstrip("=").split("*")
    return int(a), int(b)


def guess(problem: Problem) -> str:
    """The teacher's answer without the tool: the product rounded to the nearest thousand."""
    a, b = operands(problem)
    return str(round(a * b, -3))


def teacher_turns(problem: Problem, use_tool: bool) -> list[tuple[str, str]]:
    """The teacher's trajectory as (role, text) turns; the last turn ends with EOS."""
    a, b = operands(problem)
    if not use_tool:
        return [("assistant", guess(problem) + EOS_TEXT)]
    return [
        ("assistant", f"[{a}*{b}]"),
        ("tool", f"={a * b} "),
        ("assistant", problem.answer + EOS_TEXT),
    ]


def final_answer(messages: list[dict[str, str]]) -> str:
    """The answer a trajectory states: its last assistant message, if it is not a tool call."""
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    if not turns or turns[-1].endswith("]"):
        return ""
    return parse_response(turns[-1])


def score(problem_answer: str, messages: list[dict[str, str]]) -> float:
    """1.0 iff the final answer is exactly right (a trajectory cut mid-call scores 0)."""
    return 1.0 if final_answer(messages) == problem_answer else 0.0


def used_tool(messages: list[dict[str, str]]) -> bool:
    return any(m["role"] == "tool" for m in messages)
