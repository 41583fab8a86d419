"""Supervised warm start on multi-turn teacher trajectories: loss on the model's tokens only.

The same masking as RL's: tool responses are context (mask 0), never targets, so the warm
policy learns to write calls and read results, not to predict what the tool says.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from asyncrl.models.tiny import supervised_step
from asyncrl.tasks.arithmetic import EOS_TEXT, Problem

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
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id
    loss_val = float("nan")
    model.train()
    for step in range(1, steps + 1):
        rows = [
            encode_turns(tokenizer, p, turns(p, rng.random() < tool_prob))
            for p in rng.choices(problems, k=batch_size)
        ]
        loss_val = supervised_step(model, opt, rows, pad)
        if on_step is not None:
            on_step(step, steps, loss_val)
    model.eval()
    return {
        "warmup_steps_run": steps,
        "warmup_loss": loss_val,
        "warmup_seconds": time.perf_counter() - t0,
    }
