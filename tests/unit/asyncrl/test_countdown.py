"""The long-tail task: the chains, the sloppy teacher's, disjoint splits, and a shipped config
whose limits hold every chain (a cut chain would score 0 whatever the policy learned)."""

import statistics
from types import SimpleNamespace

import pytest

from asyncrl.config import ConfigError, DataConfig, load_config
from asyncrl.config.sections import COUNTDOWN_PROBLEMS
from asyncrl.models.tiny import build_model, task_tokenizer
from asyncrl.tasks import score, splits
from asyncrl.tasks.countdown import (
    POSITIONS,
    PROBLEMS,
    chain,
    make_problem,
    make_splits,
    teacher_answer,
)

CONFIG = load_config("countdown", [])


def test_a_chain_counts_down_by_b_while_it_stays_at_or_above_zero():
    assert chain(47, 9) == "47,38,29,20,11,02"
    assert chain(12, 3) == "12,09,06,03,00"
    assert chain(10, 9) == "10,01"


def test_the_sloppy_teacher_borrows_twice_and_only_where_a_step_borrows():
    assert chain(41, 6, sloppy=True) == "41,25,09,03"  # 41-6 borrows: 25, not 35
    assert chain(41, 6) == "41,35,29,23,17,11,05"
    # 10-9 borrows, but twice would go below 0: the chain ends as the teacher's
    assert chain(19, 9, sloppy=True) == chain(19, 9) == "19,10,01"
    p = make_problem(41, 6)
    assert (p.prompt, p.answer) == ("41-6=", chain(41, 6))
    assert teacher_answer(p, False) == p.answer
    assert teacher_answer(p, True) == "41,25,09,03"


def test_splits_are_disjoint_deterministic_and_bounded():
    cfg = DataConfig(task="countdown", train_size=530, val_size=100)
    train, val = splits(cfg)
    assert (len(train), len(val)) == (530, 100)
    assert not {p.prompt for p in train} & {p.prompt for p in val}
    assert make_splits(cfg) == (train, val)
    with pytest.raises(ValueError, match="630 problems"):
        make_splits(SimpleNamespace(seed=0, train_size=600, val_size=100))


def test_a_config_asking_for_more_problems_than_the_task_has_fails_naming_the_keys():
    assert COUNTDOWN_PROBLEMS == PROBLEMS == len({p.prompt for p in sum(splits(CONFIG.data), [])})
    with pytest.raises(ConfigError, match=r"data.train_size \+ data.val_size = 2200"):
        load_config(None, ["data.task=countdown"])
    assert load_config(None, ["data.task=countdown", "data.train_size=530", "data.val_size=100"])


def test_the_shipped_config_holds_every_chain_and_its_lengths_have_a_long_tail():
    cfg = load_config("countdown", [])
    tok = task_tokenizer(cfg.data)
    train, val = splits(cfg.data)
    lengths = []
    for p in train + val:
        prompt = tok(p.prompt)["input_ids"]
        answer = tok(p.answer, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in prompt + answer
        assert len(prompt) <= cfg.data.max_prompt_length
        assert len(answer) + 1 <= cfg.data.max_response_length  # and its <eos>
        lengths.append(len(answer) + 1)
    assert max(lengths) >= 3 * statistics.median(lengths)
    assert score("countdown", val[0].answer, [{"role": "assistant", "content": val[0].answer}])
    assert cfg.data.max_prompt_length + cfg.data.max_response_length <= POSITIONS
    model = build_model(cfg.actor_rollout_ref.model, len(tok), 0, POSITIONS)
    assert model.config.max_position_embeddings == POSITIONS > 64
