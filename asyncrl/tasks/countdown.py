"""A task with a long tail of response lengths: count down from ``a`` in steps of ``b``.

``47-9=`` asks for ``47,38,29,20,11,02``: every number from ``a`` down by ``b`` while it stays
at or above 0, zero-padded to two digits. A response holds ``a // b + 1`` numbers, 3 tokens
each, so its length follows ``b``: 6 numbers at ``47-9=``, 31 at ``92-3=`` (93 tokens). Over
the problems (``10 <= a <= 99``, ``3 <= b <= 9``, uniform) a response is 33 tokens on average
and 102 at most (``99-3=``), and a batch of 8 prompts waits for its longest: 66 tokens at the
median. That is the regime of RL on reasoning models, where a synchronous step's generation
lasts as long as its slowest sample (the seed's long tail), at a size that learns in minutes
on a CPU. The answers of the two other shipped tasks are all about as long (2-4 and ~25
tokens), so they have no such tail.

Each step is a two-digit subtraction with a borrow where the units digit is smaller than
``b``, which the tiny model learns as it learns carries. The warm start imitates a sloppy
teacher who, on a share of the problems (``model.warmup_drop_carry_prob``), borrows twice at
every borrow (``41-6`` -> ``25``): the warm policy continues a chain either way, greedy
decoding follows the majority, and a binary reward on the exact chain teaches it to borrow
once.
"""

from __future__ import annotations

import random
from typing import Protocol

from asyncrl.tasks.arithmetic import Problem

TASK_CHARS = ","
"""Characters the task adds to the demo tokenizer: the separator of the numbers."""
POSITIONS = 128
"""Positions of the task's model: the longest prompt (7 tokens) and response (102) fit."""
A_RANGE = (10, 99)
B_RANGE = (3, 9)
PROBLEMS = (A_RANGE[1] - A_RANGE[0] + 1) * (B_RANGE[1] - B_RANGE[0] + 1)
"""Every ``a-b=`` of the ranges: 630."""


class _DataCfg(Protocol):
    """The fields of ``asyncrl.config.DataConfig`` this module reads."""

    seed: int
    train_size: int
    val_size: int


def chain(a: int, b: int, sloppy: bool = False) -> str:
    """The numbers from ``a`` down by ``b``; ``sloppy``: borrowing twice where a step borrows
    (while that stays at or above 0; the chain then runs shorter)."""
    out = [a]
    x = a
    while x - b >= 0:
        borrows = x % 10 < b
        x = x - b - 10 if sloppy and borrows and x - b - 10 >= 0 else x - b
        out.append(x)
    return ",".join(f"{v:02d}" for v in out)


def make_problem(a: int, b: int) -> Problem:
    return Problem(prompt_id=f"down-{a}-{b}", prompt=f"{a:02d}-{b}=", answer=chain(a, b))


def make_splits(data_cfg: _DataCfg) -> tuple[list[Problem], list[Problem]]:
    """Disjoint (train, val) splits of every ``a-b=`` (630 problems), shuffled by the seed;
    train_size + val_size may not exceed them."""
    pairs = [
        (a, b) for a in range(A_RANGE[0], A_RANGE[1] + 1) for b in range(B_RANGE[0], B_RANGE[1] + 1)
    ]
    if data_cfg.train_size + data_cfg.val_size > len(pairs):
        raise ValueError(
            f"data.train_size + data.val_size = {data_cfg.train_size + data_cfg.val_size} is "
            f"more than the countdown task's {len(pairs)} problems"
        )
    random.Random(data_cfg.seed).shuffle(pairs)
    problems = [make_problem(a, b) for a, b in pairs]
    val = problems[: data_cfg.val_size]
    return problems[data_cfg.val_size :][: data_cfg.train_size], val


def operands(problem: Problem) -> tuple[int, int]:
    a, b = problem.prompt.rstrip("=").split("-")
    return int(a), int(b)


def teacher_answer(problem: Problem, sloppy: bool) -> str:
    """The warm start's target: the right chain, or the sloppy teacher's."""
    return chain(*operands(problem), sloppy=sloppy)
