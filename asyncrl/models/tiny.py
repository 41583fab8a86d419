"""The demo policy: a character-level tokenizer and a tiny Qwen2 built locally, warm-started.

Nothing is downloaded: the tokenizer is built with the ``tokenizers`` library and the model is a
randomly initialised ``Qwen2ForCausalLM`` (a real HF architecture, so the same code paths serve
real checkpoints later). A supervised warm start imitates a sloppy teacher who mostly forgets
to carry: greedy decoding is then right on ~30-40% of held-out problems, sampling finds the
right answer often enough for GRPO's binary reward, and RL visibly does the rest.

:func:`load_policy` caches the warm-started model on disk, keyed by a hash of the model and data
config, so the trainer and every rollout worker load the very same bytes (bit-identical weights,
which the weight-sync checksum relies on) and only the first process pays the warm start.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from asyncrl.models.cache import CHARS, METRICS_FILE, policy_dir
from asyncrl.tasks.arithmetic import Problem, teacher_answer

if TYPE_CHECKING:
    from asyncrl.config import ModelConfig, RunConfig

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
Builder = Callable[
    ["RunConfig"], "tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast, dict[str, Any]]"
]
"""Builds a config's warm-started policy: (model, tokenizer, metrics to keep beside it)."""


def split_characters() -> pre_tokenizers.PreTokenizer:
    r"""One piece per character, line breaks included (``[\s\S]``, not ``.``), so that a run of
    newlines is that many ``\n`` tokens, as the start-up check assumes, and decodes back to
    itself."""
    return pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")


def build_tokenizer(chars: str = CHARS) -> PreTrainedTokenizerFast:
    """Character-level tokenizer: one id per character, ``<bos>`` prepended, left padding.

    Left padding because generation batches prompts of different lengths. Decoding fuses the
    characters back with no separators, so ``decode(encode(s), skip_special_tokens=True) == s``
    for any ``s`` of ``chars``; a character outside them is one ``<unk>``.
    """
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK, *chars])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = split_characters()
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
    )


def task_tokenizer(data_cfg: Any) -> PreTrainedTokenizerFast:
    """The tokenizer of ``data_cfg.task``'s policy (the calculator task adds ``[]?``, the
    countdown ``,``), the same as the cached policy's, without loading it (``asyncrl inspect
    --text``)."""
    if data_cfg.task == "calculator":
        from asyncrl.tasks.calculator import TOOL_CHARS

        return build_tokenizer(CHARS + TOOL_CHARS)
    if data_cfg.task == "countdown":
        from asyncrl.tasks.countdown import TASK_CHARS

        return build_tokenizer(CHARS + TASK_CHARS)
    return build_tokenizer()


def build_model(
    model_cfg: ModelConfig, vocab_size: int, seed: int, positions: int = 64
) -> Qwen2ForCausalLM:
    """Randomly initialised float32 Qwen2 (tied embeddings), deterministic in ``seed``;
    ``positions``: the longest prompt + response it serves (64 at least).

    Special-token ids follow :func:`build_tokenizer` (pad 0, bos 1, eos 2). The global torch
    RNG is left untouched (the init runs under ``fork_rng``).
    """
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_hidden_layers,
        num_attention_heads=model_cfg.num_attention_heads,
        num_key_value_heads=model_cfg.num_attention_heads,
        max_position_embeddings=max(64, positions),
        tie_word_embeddings=True,
        use_cache=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.float().eval()


def encode_problems(
    tokenizer: PreTrainedTokenizerFast,
    problems: list[Problem],
    drop_carry: bool = False,
    teacher: Callable[[Problem, bool], str] = teacher_answer,
) -> list[tuple[list[int], list[int]]]:
    """(prompt_ids, answer_ids + [eos]) per problem: the supervised targets of the warm start.

    With ``drop_carry`` the targets are the sloppy teacher's answers (``teacher``: the task's;
    arithmetic's drops its carries).
    """
    out = []
    for p in problems:
        prompt = tokenizer(p.prompt)["input_ids"]
        text = teacher(p, drop_carry)
        answer = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append((prompt, answer + [tokenizer.eos_token_id]))
    return out


def supervised_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rows: list[tuple[list[int], list[int], list[int]]],
    pad_token_id: int,
) -> float:
    """One optimizer step of cross-entropy on ``(prompt, response, mask)`` rows: the response
    tokens with mask 1 are the targets (the prompt and mask-0 tokens are context only)."""
    width = max(len(prompt) + len(resp) for prompt, resp, _ in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (prompt, resp, mask) in enumerate(rows):
        n = len(prompt) + len(resp)
        ids[r, :n] = torch.tensor(prompt + resp)
        attn[r, :n] = 1
        labels[r, len(prompt) : n] = torch.tensor(
            [t if m else -100 for t, m in zip(resp, mask, strict=True)]
        )
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def load_policy(
    cfg: RunConfig, build: Builder | None = None
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """The warm-started policy (eval mode, float32, CPU) and its tokenizer, built once per config
    by ``build`` (``asyncrl.models.warm_start.build``; without one, a missing entry is an error).

    The first caller builds, warm-starts and saves into a fresh temp dir beside the cache entry,
    then renames it into place; rename is atomic, so a racing process either wins or finds the
    entry taken and throws its own copy away. Everyone then loads from disk, so all processes,
    builder included, hold bit-identical weights.
    """
    hf_logging.disable_progress_bar()  # tqdm bars for a 1 MB model are noise in our logs
    final = policy_dir(cfg)
    if not (final / METRICS_FILE).exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        if build is None:
            raise RuntimeError(
                f"the demo policy of this config is not built yet ({final}): load it with "
                "asyncrl.models.warm_start.load_policy, which builds it (asyncrl run does)"
            )
        model, tokenizer, metrics = build(cfg)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            # Written last: its presence marks a complete entry.
            (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2))
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / METRICS_FILE).exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    model = Qwen2ForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(final)
    # A policy cached before split_characters holds the old split: the same ids for every
    # character of its alphabet, so it is kept, with the split of today.
    tokenizer.backend_tokenizer.pre_tokenizer = split_characters()
    return model, tokenizer
