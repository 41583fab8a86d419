"""The built-in model's character tokenizer: one token per character, newlines included, and
the demo tasks' ids as they always were (a cached policy was warm-started on them)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, pre_tokenizers

from asyncrl.config import load_config
from asyncrl.models import tiny
from asyncrl.models.tiny import build_model, build_tokenizer, task_tokenizer
from tests.helpers import SMALL_MODEL


def test_each_newline_is_its_own_token_and_decodes_back():
    """The split on ``.`` left a run of newlines one piece: ``a\\n\\nb`` read as one <unk>
    with ``\\n`` in the alphabet, and decoded to ``ab``."""
    tok = build_tokenizer("ab\n")
    ids = tok("a\n\nb\n")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<bos>", "a", "\n", "\n", "b", "\n"]
    assert tok.decode(ids, skip_special_tokens=True) == "a\n\nb\n"


def test_a_character_outside_the_alphabet_is_one_unk_each():
    tok = build_tokenizer()  # the demo's: no newline
    ids = tok("1\n\n2")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<bos>", "1", "<unk>", "<unk>", "2"]


def test_the_demo_tasks_ids_do_not_change():
    """Pinned: a cached policy was warm-started on these ids."""
    cfg = load_config()
    assert build_tokenizer()("07+35= 42")["input_ids"] == [1, 4, 11, 14, 7, 9, 17, 20, 8, 6]
    calculator = task_tokenizer(load_config("calculator").data)
    assert calculator("[3*4]?")["input_ids"] == [1, 21, 7, 16, 8, 22, 23]
    countdown = task_tokenizer(load_config("countdown").data)
    assert countdown("(1,2)")["input_ids"] == [1, 18, 5, 21, 6, 19]
    assert len(task_tokenizer(cfg.data)) == 21


def test_a_policy_cached_with_the_old_split_loads_with_the_new_one(tmp_path: Path):
    cfg = load_config(None, [*SMALL_MODEL, f"actor_rollout_ref.model.cache_dir={tmp_path}"])

    def build(_cfg):
        tok = build_tokenizer("ab\n")
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
        return build_model(cfg.actor_rollout_ref.model, len(tok), 0), tok, {}

    _, tok = tiny.load_policy(cfg, build)
    assert tok("a\n\nb")["input_ids"] == [1, 4, 6, 6, 5]
