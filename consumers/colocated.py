"""Synchronous single-process GRPO, readable top to bottom: the "colocated sync" baseline.

Every step: take ``ppo_mini_batch_size`` prompts, sample ``rollout.n`` responses for each with
the current weights, score them, turn rewards into group-relative advantages, do one clipped
policy-gradient update. No Kafka, no processes, no staleness: what the async system must match
in accuracy and beat in throughput on bigger machines.

    python -m asyncrl.consumers.colocated trainer.seed=1 actor_rollout_ref.rollout.n=8
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from asyncrl.consumers.grpo import build_batch, group_advantages
from asyncrl.consumers.update import policy_step
from asyncrl.models.tiny import greedy_accuracy, load_policy, warm_start_metrics
from asyncrl.ops.config import RunConfig, load_config
from asyncrl.producers.engines.base import GenRequest
from asyncrl.producers.engines.hf import HFEngine
from asyncrl.tasks.arithmetic import Problem, make_splits, score


def resolve_device(name: str) -> torch.device:
    """``auto`` means CUDA when available, else CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def prompt_stream(problems: list[Problem], seed: int) -> Iterator[Problem]:
    """Endless epochs over ``problems``, reshuffled each epoch with a seeded RNG."""
    rng = random.Random(seed)
    order = list(problems)
    while True:
        rng.shuffle(order)
        yield from order


def main(cfg: RunConfig, log: Callable[[str], Any] = print) -> list[dict[str, Any]]:
    """Run GRPO for ``trainer.total_training_steps`` (or until ``target_accuracy``).

    Returns one dict per step (``step, reward, time_s, ...`` plus ``val_acc`` on eval steps;
    step 0 is the warm-started policy). ``time_s`` counts from the start of RL, after the
    (cached) warm start.
    """
    torch.manual_seed(cfg.trainer.seed)
    arr, actor = cfg.actor_rollout_ref, cfg.actor_rollout_ref.actor
    device = resolve_device(cfg.trainer.device)

    # --- policy, data, engine, optimiser ------------------------------------------------------
    model, tok = load_policy(cfg)
    model.to(device)
    if cfg.data.task != "arithmetic":
        raise ValueError(f"the colocated baseline runs data.task=arithmetic, not {cfg.data.task}")
    train, val = make_splits(cfg.data)
    prompts = prompt_stream(train, cfg.trainer.seed)
    engine = HFEngine(
        model, tok, arr.rollout.temperature, tok.eos_token_id, tok.pad_token_id, cfg.trainer.seed
    )
    opt = torch.optim.AdamW(
        model.parameters(), lr=actor.optim.lr, weight_decay=actor.optim.weight_decay
    )
    max_len = cfg.data.max_response_length

    def evaluate() -> float:
        model.eval()
        return greedy_accuracy(model, tok, val, max_len)

    ws = warm_start_metrics(cfg) or {}
    history: list[dict[str, Any]] = [{"step": 0, "val_acc": evaluate(), "time_s": 0.0}]
    log(
        f"warm start: {ws.get('warmup_steps_run')} steps, {ws.get('warmup_seconds', 0):.1f}s | "
        f"step 0 val_acc {history[0]['val_acc']:.3f}"
    )
    t_start = time.perf_counter()
    gen_s = train_s = 0.0
    n_traj = 0

    for step in range(1, cfg.trainer.total_training_steps + 1):
        # --- rollout: n samples per prompt with the current weights --------------------------
        t0 = time.perf_counter()
        batch_prompts = [next(prompts) for _ in range(actor.ppo_mini_batch_size)]
        reqs = [
            GenRequest(f"{p.prompt_id}/{j}", tok(p.prompt)["input_ids"], max_len)
            for p in batch_prompts
            for j in range(arr.rollout.n)
        ]
        model.eval()
        results = engine.generate(reqs)

        # --- reward and group-relative advantage ----------------------------------------------
        rewards = torch.tensor(
            [
                score(p.answer, tok.decode(r.response_ids, skip_special_tokens=True))
                for p, r in zip(
                    (p for p in batch_prompts for _ in range(arr.rollout.n)), results, strict=True
                )
            ]
        ).view(len(batch_prompts), arr.rollout.n)
        adv = group_advantages(rewards, cfg.algorithm.norm_adv_by_std_in_grpo).flatten()
        t1 = time.perf_counter()

        # --- one clipped policy-gradient update -----------------------------------------------
        batch = build_batch(
            [
                (r.prompt_ids, r.response_ids, r.response_logprobs, a)
                for r, a in zip(results, adv.tolist(), strict=True)
            ],
            tok.pad_token_id,
        ).to(device)
        model.train()
        metrics = policy_step(model, opt, batch, cfg)
        t2 = time.perf_counter()
        gen_s, train_s, n_traj = gen_s + (t1 - t0), train_s + (t2 - t1), n_traj + len(results)

        # --- log, evaluate, stop ---------------------------------------------------------------
        row: dict[str, Any] = {
            "step": step,
            "reward": float(rewards.mean()),
            "response_len": float(batch.response_mask.sum(-1).mean()),
            **metrics,
            "gen_samples_per_s": n_traj / gen_s,
            "train_samples_per_s": n_traj / train_s,
        }
        test_freq = cfg.trainer.test_freq
        last = step == cfg.trainer.total_training_steps
        if (test_freq and step % test_freq == 0) or last:
            row["val_acc"] = evaluate()
        row["time_s"] = time.perf_counter() - t_start
        history.append(row)
        if "val_acc" in row:
            log(
                f"step {step:4d} | val_acc {row['val_acc']:.3f} | reward {row['reward']:.3f} | "
                f"kl {row['ppo_kl']:+.1e} | gen {row['gen_samples_per_s']:.0f}/s | "
                f"train {row['train_samples_per_s']:.0f}/s | {row['time_s']:.1f}s"
            )
            target = cfg.trainer.target_accuracy
            if target is not None and row["val_acc"] >= target:
                log(f"reached val_acc {row['val_acc']:.3f} >= {target} at step {step}")
                break
    return history


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(int(os.environ.get("ASYNCRL_TORCH_THREADS", "1")))
    main(load_config(overrides=sys.argv[1:]))
