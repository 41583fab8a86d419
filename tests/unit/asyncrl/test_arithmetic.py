"""The demo task: disjoint splits, the sloppy teacher's carry-less sums, exact-match reward."""

import pytest

from asyncrl.config import DataConfig
from asyncrl.tasks.arithmetic import carryless_sum, make_problem, make_splits, score, teacher_answer


@pytest.mark.parametrize(
    "a, b, want", [(57, 68, 15), (7, 35, 32), (12, 34, 46), (99, 99, 88), (0, 0, 0)]
)
def test_carryless_sum_drops_every_carry(a, b, want):
    assert carryless_sum(a, b) == want


def test_teacher_answer_is_correct_unless_it_drops_carries():
    p = make_problem(57, 68)
    assert (p.prompt, p.answer) == ("57+68=", "125")
    assert teacher_answer(p, drop_carry=False) == "125"
    assert teacher_answer(p, drop_carry=True) == "15"
    no_carry = make_problem(12, 34)
    assert teacher_answer(no_carry, drop_carry=True) == no_carry.answer


def test_splits_are_disjoint_even_up_to_commutativity():
    train, val = make_splits(DataConfig(train_size=2000, val_size=200))
    assert (len(train), len(val)) == (2000, 200)
    pair = lambda p: frozenset(p.prompt.rstrip("=").split("+"))  # noqa: E731
    assert not {pair(p) for p in train} & {pair(p) for p in val}
    assert make_splits(DataConfig(train_size=2000, val_size=200)) == (train, val)


def test_score_is_exact_match():
    assert score("42", "42") == 1.0
    assert score("42", " 42<eos>junk") == 1.0
    assert score("42", "4") == 0.0
    assert score("42", "420") == 0.0
