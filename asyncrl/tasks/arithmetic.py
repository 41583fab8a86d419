"""Synthetic addition task: prompts ``"07+35="``, answer the decimal sum, reward 1 if exact.

The task is chosen so that a ~100k-parameter causal LM can learn the algorithm (digit-wise
addition with carries) on two CPU cores in minutes: a short supervised warm start gets it to
~20-35% held-out accuracy, and GRPO with a binary reward then lifts it past 90%.

Held-out means held-out: the split is made over *unordered* operand pairs, so ``7+35`` and
``35+7`` always land on the same side and commutativity cannot leak answers from train to val.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

EOS_TEXT = "<eos>"
"""Textual end-of-sequence marker; :func:`score` ignores everything from it on."""
POSITIONS = 64
"""Positions of the task's model (a prompt and its answer take ~10)."""


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer; ``prompt_id`` is stable across processes/runs."""

    prompt_id: str
    prompt: str
    answer: str


class _DataCfg(Protocol):
    """The fields of ``asyncrl.config.DataConfig`` this module reads."""

    seed: int
    train_size: int
    val_size: int
    max_operand: int


def make_problem(a: int, b: int, width: int = 2) -> Problem:
    """The problem ``a+b=``, operands zero-padded to ``width`` digits (``7+35`` -> ``07+35=``).

    Fixed-width operands put each digit at a fixed position, which a tiny model picks up in a
    few hundred supervised steps; unpadded prompts (digits shifting with operand length) took a
    2-layer model several times longer. The answer is the plain decimal sum (``42``, ``128``).
    """
    return Problem(
        prompt_id=f"add-{a}-{b}", prompt=f"{a:0{width}d}+{b:0{width}d}=", answer=str(a + b)
    )


def make_splits(data_cfg: _DataCfg) -> tuple[list[Problem], list[Problem]]:
    """Deterministic, disjoint (train, val) splits of ``a+b=`` with ``0 <= a, b <= max_operand``.

    Operands are zero-padded to the width of ``max_operand`` (see :func:`make_problem`).

    Unordered pairs {a, b} are shuffled with ``random.Random(seed)``; val is filled first, then
    train, each pair contributing both of its orders (a pair that would overflow a split is cut,
    its leftover order dropped, never moved to the other split). Same config, same splits, in
    every process.
    """
    hi = data_cfg.max_operand
    width = len(str(hi))
    pairs = [(a, b) for a in range(hi + 1) for b in range(a, hi + 1)]
    total = (hi + 1) ** 2
    if data_cfg.train_size + data_cfg.val_size > total - 1:
        raise ValueError(
            f"train_size + val_size = {data_cfg.train_size + data_cfg.val_size} is too large "
            f"for operands up to {hi} ({total} problems)"
        )
    rng = random.Random(data_cfg.seed)
    rng.shuffle(pairs)
    val: list[Problem] = []
    train: list[Problem] = []
    for a, b in pairs:
        if len(val) < data_cfg.val_size:
            target, size = val, data_cfg.val_size
        else:
            target, size = train, data_cfg.train_size
        if len(target) >= size:
            break
        orders = [(a, b)] if a == b else [(a, b), (b, a)]
        rng.shuffle(orders)
        target.extend(make_problem(x, y, width) for x, y in orders[: size - len(target)])
    rng.shuffle(train)
    return train, val


def carryless_sum(a: int, b: int) -> int:
    """``a + b`` computed digit by digit with every carry dropped (``57+68`` -> ``15``).

    The one mistake of the warm start's sloppy teacher (see :func:`teacher_answer`).
    """
    out, place = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def operands(problem: Problem) -> tuple[int, int]:
    """``(a, b)`` of a problem made by :func:`make_problem`."""
    a, b = problem.prompt.rstrip("=").split("+")
    return int(a), int(b)


def teacher_answer(problem: Problem, drop_carry: bool) -> str:
    """The answer a sloppy teacher writes: correct, or with its carries dropped.

    The warm start imitates a teacher who forgets carries some of the time. The policy learns
    both answers for every problem that has a carry; greedy decoding picks the more frequent
    (wrong) one, while sampling still finds the right one often enough for a binary reward to
    teach the policy to carry. Problems without a carry are right either way.
    """
    return str(carryless_sum(*operands(problem))) if drop_carry else problem.answer


def parse_response(response_text: str) -> str:
    """The answer a response states: the text up to the first ``<eos>``, stripped of spaces.

    Callers normally pass the decoded response with special tokens skipped (generation already
    stops at EOS, so nothing follows it); the cut at a literal ``<eos>`` also makes the scorer
    safe for text decoded with special tokens kept.
    """
    return response_text.split(EOS_TEXT, 1)[0].strip()


def score(problem_answer: str, response_text: str) -> float:
    """Binary rule-based reward: 1.0 iff the parsed response equals the answer exactly.

    No partial credit (``"46"`` vs ``"4"`` or ``"460"`` is 0.0): the demo shows RL working from
    a sparse outcome reward, like verifiable-reward math RL.
    """
    return 1.0 if parse_response(response_text) == problem_answer else 0.0
