"""The demo policy's supervised warm start, before RL: build a tiny model from its config and
teach it the task from a teacher's answers, so that RL has something to improve.

Arithmetic: the teacher mostly forgets to carry (:func:`asyncrl.tasks.arithmetic.teacher_answer`);
the countdown task: it borrows twice (:func:`asyncrl.tasks.countdown.teacher_answer`).
The calculator task: multi-turn teacher trajectories that call the tool with
``warmup_tool_prob``; the loss is on the model's own tokens only, as in RL (tool responses are
context, mask 0), so the policy learns to write calls and read results.

Its held-out accuracy is measured as the trainer measures it before its first step
(``held_out_accuracy``), so the launcher's warm-start line and ``val/accuracy_initial`` agree;
with rollout.name=vllm on hf_cached (greedy answers equal vLLM's up to float noise), so that
building it starts no vLLM engine.
:func:`load_policy` is what processes call: a checkpoint (``model.path``), or the demo policy,
built here on first use and cached (``asyncrl.models.tiny``).
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from asyncrl import tasks
from asyncrl.models import policy
from asyncrl.models.tiny import (
    build_model,
    encode_problems,
    supervised_step,
    task_tokenizer,
)
from asyncrl.producers.agent.eval_engine import on_transformers
from asyncrl.producers.agent.factory import greedy_accuracy, held_out_accuracy, held_out_set
from asyncrl.tasks.arithmetic import EOS_TEXT, Problem, teacher_answer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

    from asyncrl.config import ModelConfig, RunConfig

OnStep = Callable[[int, int, float], None]
"""``on_step(step, total, loss)``, after every warm-start step (progress output)."""


def load_policy(
    cfg: RunConfig,
    on_step: OnStep | None = None,
    dtype: torch.dtype | None = None,
    warm: bool = True,
) -> tuple[torch.nn.Module, Any]:
    """(model in eval mode, on the CPU, float32 or ``dtype``; its tokenizer) for this run's
    config: the checkpoint at ``model.path``, or the demo policy, warm-started here the first
    time (in float32, and cached so). ``warm=False``, for a caller that loads a checkpoint's
    weights over it (``replay step``): the demo policy's model untrained, not warm-started,
    since the checkpoint overwrites its weights and a warm start (minutes for the countdown
    task, another one for each ``data.*`` override in its cache key) would be wasted."""
    if not warm and cfg.actor_rollout_ref.model.path is None:
        tiny, tokenizer = untrained(cfg)
        model: torch.nn.Module = tiny
        if dtype is not None:
            model.to(dtype)
        return model.eval(), policy.with_tiny_template(tokenizer)
    build_it = functools.partial(build, on_step=on_step)
    return policy.load_policy(cfg, build=build_it, dtype=dtype)


def untrained(cfg: RunConfig) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """The demo policy's model as its warm start begins (random weights, seeded) and its
    tokenizer: the one shape a checkpoint of the demo policy fits."""
    task = tasks.module(cfg.data.task)
    tokenizer = task_tokenizer(cfg.data)
    model = build_model(cfg.actor_rollout_ref.model, len(tokenizer), cfg.data.seed, task.POSITIONS)
    return model, tokenizer


def build(
    cfg: RunConfig, on_step: OnStep | None = None
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast, dict[str, Any]]:
    """A config's demo policy, warm-started, with its metrics (kept beside it in the cache)."""
    mc = cfg.actor_rollout_ref.model
    threads = torch.get_num_threads()
    # One thread: the same weights on every machine (a sum over threads rounds differently,
    # and the cache key cannot see how many threads the building process had).
    torch.set_num_threads(1)
    try:
        model, tokenizer, metrics = _train(cfg, mc, on_step)
    finally:
        torch.set_num_threads(threads)
    tokenizer = policy.with_tiny_template(tokenizer)  # the held-out prompts may be chat
    # on transformers whatever rollout.name says: this measures the warm start, and a vLLM
    # engine started here would stay in the process that builds it
    on_hf = on_transformers(cfg)
    measured = held_out_accuracy(on_hf, model, tokenizer, held_out_set(cfg, tokenizer))
    metrics["warmup_val_accuracy"] = measured["accuracy"]
    if "tool_use" in measured:
        metrics["warmup_val_tool_use"] = measured["tool_use"]
    return model, tokenizer, metrics


def _train(
    cfg: RunConfig, mc: ModelConfig, on_step: OnStep | None
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast, dict[str, Any]]:
    task = tasks.module(cfg.data.task)
    model, tokenizer = untrained(cfg)
    train, _val = tasks.splits(cfg.data)
    if cfg.data.task == "calculator":
        metrics = warm_start_turns(
            model,
            tokenizer,
            train,
            task.teacher_turns,
            tool_prob=mc.warmup_tool_prob,
            steps=mc.warmup_steps,
            batch_size=mc.warmup_batch_size,
            lr=mc.warmup_lr,
            seed=cfg.data.seed,
            on_step=on_step,
        )
    else:
        metrics = warm_start(
            model,
            tokenizer,
            train,
            mc,
            seed=cfg.data.seed,
            max_new_tokens=cfg.data.max_response_length,
            on_step=on_step,
            teacher=task.teacher_answer,
        )
    return model, tokenizer, metrics


def warm_start(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    train_problems: list[Problem],
    model_cfg: ModelConfig,
    seed: int = 0,
    max_new_tokens: int = 8,
    on_step: Callable[[int, int, float], None] | None = None,
    teacher: Callable[[Problem, bool], str] = teacher_answer,
) -> dict[str, Any]:
    """Supervised training on the sloppy teacher's answers; returns metrics.

    ``on_step(step, total, loss)`` is called after every step (for progress output).

    Each target is the sloppy teacher's answer with probability ``warmup_drop_carry_prob``,
    else the correct one (``teacher``: the task's; arithmetic's drops the carries, see
    :func:`asyncrl.tasks.arithmetic.teacher_answer`).

    Cross-entropy on the answer tokens and EOS only (the prompt is given, not learned), AdamW at
    ``warmup_lr``, batches of ``warmup_batch_size`` drawn with a generator seeded by ``seed``.
    Stops after ``warmup_steps`` or, earlier, once greedy accuracy on a fixed probe of 200
    *training* prompts reaches ``warmup_target_accuracy`` (val is never used to stop).
    """
    t0 = time.perf_counter()
    pairs = encode_problems(tokenizer, train_problems, teacher=teacher)
    sloppy = encode_problems(tokenizer, train_problems, drop_carry=True, teacher=teacher)
    probe = train_problems[:200]
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=model_cfg.warmup_lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id
    loss_val, steps, probe_acc = float("nan"), 0, float("nan")
    target = model_cfg.warmup_target_accuracy
    model.train()
    for step in range(1, model_cfg.warmup_steps + 1):
        idx = torch.randint(len(pairs), (model_cfg.warmup_batch_size,), generator=gen).tolist()
        drop = torch.rand(len(idx), generator=gen) < model_cfg.warmup_drop_carry_prob
        rows = [sloppy[i] if d else pairs[i] for i, d in zip(idx, drop.tolist(), strict=True)]
        loss_val = supervised_step(model, opt, [(p, a, [1] * len(a)) for p, a in rows], pad)
        steps = step
        if on_step is not None:
            on_step(step, model_cfg.warmup_steps, loss_val)
        if target is not None and step % model_cfg.warmup_eval_every == 0:
            model.eval()
            probe_acc = greedy_accuracy(model, tokenizer, probe, max_new_tokens)
            model.train()
            if probe_acc >= target:
                break
    model.eval()
    metrics: dict[str, Any] = {
        "warmup_steps_run": steps,
        "warmup_loss": loss_val,
        "warmup_probe_accuracy": None if probe_acc != probe_acc else probe_acc,  # NaN: no probe
        "warmup_seconds": time.perf_counter() - t0,
    }
    return metrics


Turns = Callable[[Problem, bool], list[tuple[str, str]]]
"""``(problem, use_tool) -> [(role, text), ...]``: a task's teacher trajectory."""


def encode_turns(
    tokenizer: Any, problem: Problem, turns: Sequence[tuple[str, str]]
) -> tuple[list[int], list[int], list[int]]:
    """(prompt_ids, response_ids, response_mask): mask 1 on assistant tokens (EOS included)."""
    prompt = tokenizer(problem.prompt)["input_ids"]
    ids: list[int] = []
    mask: list[int] = []
    for role, text in turns:
        eos = text.endswith(EOS_TEXT)
        part = tokenizer(text.removesuffix(EOS_TEXT), add_special_tokens=False)["input_ids"]
        part = part + ([tokenizer.eos_token_id] if eos else [])
        ids += part
        mask += [1 if role == "assistant" else 0] * len(part)
    return prompt, ids, mask


def teacher_draws(
    problems: list[Problem], tool_prob: float, steps: int, batch_size: int, seed: int
) -> Iterator[list[tuple[Problem, bool]]]:
    """Each warm-start step's batch of (problem, whether the teacher calls the tool), from one
    generator seeded by ``seed``: the same draws on every machine, whatever its kernels."""
    rng = random.Random(seed)
    for _ in range(steps):
        yield [(p, rng.random() < tool_prob) for p in rng.choices(problems, k=batch_size)]


def warm_start_turns(
    model: torch.nn.Module,
    tokenizer: Any,
    problems: list[Problem],
    turns: Turns,
    tool_prob: float,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    on_step: Callable[[int, int, float], None] | None = None,
) -> dict[str, Any]:
    """``steps`` of AdamW on teacher trajectories that use the tool with ``tool_prob``."""
    t0 = time.perf_counter()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id
    loss_val = float("nan")
    model.train()
    draws = teacher_draws(problems, tool_prob, steps, batch_size, seed)
    for step, batch in enumerate(draws, start=1):
        rows = [encode_turns(tokenizer, p, turns(p, use_tool)) for p, use_tool in batch]
        loss_val = supervised_step(model, opt, rows, pad)
        if on_step is not None:
            on_step(step, steps, loss_val)
    model.eval()
    return {
        "warmup_steps_run": steps,
        "warmup_loss": loss_val,
        "warmup_seconds": time.perf_counter() - t0,
    }
