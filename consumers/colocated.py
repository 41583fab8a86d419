"""Synchronous single-process GRPO, readable top to bottom: the "colocated sync" baseline.

Every step: take the trainer's step of prompts (``require_batches x ppo_mini_batch_size``),
sample ``rollout.n`` responses for each with the current weights (through the same agent loop
as the rollout workers, so the calculator task's tool calls run here too; each decoding step
waits for the calls it started, so a run with the same seed repeats exactly), score them
with the rollout workers' reward (the task's rule, or ``custom_reward_function``), turn
rewards into group-relative advantages, do one clipped policy-gradient update per mini-batch.
With ``algorithm.filter_groups.enable`` (DAPO's dynamic sampling) the groups whose answers all
score the same are left out and further batches are generated until the step is full, as
DAPO's trainer does. No Kafka, no processes, no staleness: what the async system must match in
accuracy and beat in throughput. It reads what an ``asyncrl run`` of the same config reads:
``data.task``'s problems or ``data.train_files``/``val_files``, the built-in model or
``actor_rollout_ref.model.path``.

    python -m asyncrl.consumers.colocated trainer.seed=1 actor_rollout_ref.rollout.n=8
    python -m asyncrl.consumers.colocated --config calculator
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from asyncrl.config import RunConfig, load_config
from asyncrl.consumers.dynamic_sampling import check_gen_batches, filter_metrics, no_signal
from asyncrl.consumers.schedule import set_step_lr
from asyncrl.consumers.update import grpo_update, reference_policy
from asyncrl.models.cache import warm_start_metrics
from asyncrl.models.policy import resolve_device
from asyncrl.models.warm_start import load_policy
from asyncrl.producers.agent.factory import held_out_accuracy, held_out_set, make_runner
from asyncrl.producers.agent.runner import AgentRunner
from asyncrl.producers.agent.state import AgentState
from asyncrl.producers.engines import factory as engines
from asyncrl.producers.feed import feed_sequence, train_prompts
from asyncrl.producers.in_flight import generated, with_score
from asyncrl.producers.reward import Scored, make_reward
from asyncrl.producers.reward_pool import make_pool
from asyncrl.producers.scoring import TrajectoryScorer
from asyncrl.schemas.prompt import PromptRecord
from asyncrl.schemas.sample import Sample


def prompt_stream(cfg: RunConfig, train: list[PromptRecord]) -> Iterator[PromptRecord]:
    """Endless epochs over ``train`` in the async run's feed order (shuffled by data.seed, as
    ``asyncrl run`` writes its prompts topic), so a side-by-side comparison trains on the same
    prompts in the same order; it shuffled by trainer.seed before."""
    return feed_sequence(cfg, train)


def rollout(
    runner: AgentRunner,
    scorer: TrajectoryScorer,
    prompts: list[PromptRecord],
    n: int,
    cfg: RunConfig,
) -> list[Sample]:
    """``n`` trajectories per prompt with the current weights, each through the agent loop
    (one turn, or turns and tool calls with ``multi_turn.enable``), scored by ``scorer`` as a
    rollout worker scores them (the task's rule or custom_reward_function, each scored as it
    finishes; a failure is marked, not trained on)."""
    max_len = cfg.data.max_prompt_length
    prompt_ids = [runner.prompt_ids(p.chat() or p.prompt, max_len) for p in prompts]
    for i, (p, ids) in enumerate(zip(prompts, prompt_ids, strict=True)):
        for j in range(n):
            state = runner.start_state(ids, p.chat() or p.prompt, p.reward_extra_info())
            runner.add(f"{i}/{j}", state)
    finished: dict[str, AgentState] = {}
    while runner.busy:
        for rid, state in runner.step():
            finished[rid] = state
            i = int(rid.split("/")[0])
            scorer.submit(rid, prompts[i], state, rid)
        if not runner.engine.num_active:
            time.sleep(0.001)  # every trajectory is waiting on a tool
    scores: dict[str, tuple[Scored, float]] = {}
    while len(scores) < len(finished):
        for rid, scored, seconds in scorer.results(timeout=1.0):
            scores[rid] = (scored, seconds)
    samples = []
    for i, (p, ids) in enumerate(zip(prompts, prompt_ids, strict=True)):
        trajectories = []
        for j in range(n):
            s, (scored, seconds) = finished[f"{i}/{j}"], scores[f"{i}/{j}"]
            trajectories.append(
                with_score(generated(s, finish_reason=s.finish_reason), scored, seconds)
            )
        prompt = np.array(ids, np.int32)
        samples.append(Sample(p.prompt_id, p.prompt_id, 0, prompt, p.ground_truth, trajectories))
    return samples


def step_batch(
    runner: AgentRunner,
    scorer: TrajectoryScorer,
    prompts: Iterator[PromptRecord],
    cfg: RunConfig,
    step: int,
) -> tuple[list[Sample], int, int]:
    """One step's samples: ``required_samples`` prompts, rolled out. With dynamic sampling,
    DAPO's loop (``recipe/dapo/dapo_ray_trainer.py``): generate a batch of that many prompts,
    leave out the groups with no signal, and generate again until enough are kept (kept ones
    beyond the step are cut off), failing after ``max_num_gen_batches`` batches. Returns the
    samples, the groups filtered and the groups generated."""
    need, n = cfg.required_samples, cfg.actor_rollout_ref.rollout.n
    fg = cfg.filters_groups  # as the async trainer applies it
    kept: list[Sample] = []
    filtered = generated = 0
    while True:
        samples = rollout(runner, scorer, [next(prompts) for _ in range(need)], n, cfg)
        generated += len(samples)
        if fg is None:
            return samples, 0, generated
        for s in samples:
            if no_signal(s, fg) is None:
                kept.append(s)
            else:
                filtered += 1
        if len(kept) >= need:
            return kept[:need], filtered, generated
        check_gen_batches(fg, len(kept), filtered, need, step)


def main(cfg: RunConfig, log: Callable[[str], Any] = print) -> list[dict[str, Any]]:
    """Run GRPO for ``trainer.total_training_steps`` (or until ``target_accuracy``).

    Returns one dict per step (``step, reward, time_s, ...`` plus ``val_acc`` on eval steps,
    and ``val_tool_use`` with the agent loop on; step 0 is the warm-started policy).
    ``time_s`` counts from the start of RL, after the (cached) warm start.
    """
    torch.manual_seed(cfg.trainer.seed)
    arr, actor = cfg.actor_rollout_ref, cfg.actor_rollout_ref.actor
    device = resolve_device(cfg.trainer.device)

    # --- policy, data, engine, agent loop, optimiser -----------------------------------------
    model, tok = load_policy(cfg)
    model.to(device)
    ref_model = reference_policy(cfg, device, start=model)  # actor.use_kl_loss: frozen
    # The prompts, held-out set and reward of the async run: data.task's problems, or the rows
    # of data.train_files/val_files that fit data.max_prompt_length, scored by data.task's
    # rule, each row's data_source's or custom_reward_function.
    train, _ = train_prompts(cfg)
    val = held_out_set(cfg, tok)
    prompts = prompt_stream(cfg, train)
    reward = make_reward(cfg)
    scorer = TrajectoryScorer(
        reward,
        tok,
        0,
        overlong=cfg.algorithm.overlong_buffer,
        max_resp_len=cfg.data.max_response_length,
        pool=make_pool(cfg, reward),
    )
    # The engine rollout.name names (auto: hf_static on a GPU, hf_cached on a CPU), as the
    # rollout workers generate.
    engine = engines.make_engine(cfg, model, tok, cfg.trainer.seed)
    # Waiting for each step's tool calls (no overlap with decoding, which a synchronous
    # baseline does not claim anyway) makes a run repeat exactly: see AgentRunner.
    runner = make_runner(cfg, tok, engine, wait_for_tools=True)
    opt = torch.optim.AdamW(
        model.parameters(), lr=actor.optim.lr, weight_decay=actor.optim.weight_decay
    )

    def evaluate() -> dict[str, float]:
        model.eval()
        # on the rollout engine itself (holding the current weights, nothing else in flight):
        # vLLM allows one engine per process
        measured = held_out_accuracy(cfg, model, tok, val, running=engine, idle=True)
        return {f"val_{k if k == 'tool_use' else 'acc'}": v for k, v in measured.items()}

    try:
        history: list[dict[str, Any]] = [{"step": 0, **evaluate(), "time_s": 0.0}]
        ws = warm_start_metrics(cfg) if cfg.actor_rollout_ref.model.path is None else None
        policy = (
            f"warm start (cached; it took {ws.get('warmup_steps_run')} steps, "
            f"{ws.get('warmup_seconds', 0):.1f}s when built)"
            if ws is not None
            else f"policy {cfg.actor_rollout_ref.model.path}"
        )
        log(f"{policy} | step 0 val_acc {history[0]['val_acc']:.3f}")
        t_start = time.perf_counter()
        gen_s = train_s = 0.0
        n_traj = n_gen = total_filtered = 0

        for step in range(1, cfg.trainer.total_training_steps + 1):
            # --- rollout: n samples per prompt with the current weights, scored ---------------
            t0 = time.perf_counter()
            model.eval()
            samples, filtered, generated = step_batch(runner, scorer, prompts, cfg, step)
            t1 = time.perf_counter()

            # --- group-relative advantages and one clipped policy-gradient update -------------
            model.train()
            set_step_lr(opt, actor.optim, step, cfg.trainer.total_training_steps)
            metrics = grpo_update(
                model, opt, samples, cfg, device, tok.pad_token_id, ref_model=ref_model
            )
            # the update changed model in place: an engine holding a copy of the weights
            # (vLLM) loads them, one reading model (hf_cached) drops what it derived from it
            engine.update_weights(lambda _model: None)
            t2 = time.perf_counter()
            n_traj += len(samples) * arr.rollout.n
            n_gen += generated * arr.rollout.n
            gen_s, train_s = gen_s + (t1 - t0), train_s + (t2 - t1)
            if cfg.filters_groups is not None:
                total_filtered += filtered
                metrics.update(filter_metrics(filtered, len(samples), total_filtered))

            # --- log, evaluate, stop -----------------------------------------------------------
            row: dict[str, Any] = {
                "step": step,
                "reward": metrics["critic/score/mean"],
                "response_len": metrics["response_length/mean"],
                "ppo_kl": metrics["actor/ppo_kl"],
                **metrics,
                "gen_samples_per_s": n_gen / gen_s,
                "train_samples_per_s": n_traj / train_s,
            }
            test_freq = cfg.trainer.test_freq
            last = step == cfg.trainer.total_training_steps
            if (test_freq and step % test_freq == 0) or last:
                row.update(evaluate())
            row["time_s"] = time.perf_counter() - t_start
            history.append(row)
            if "val_acc" in row:
                tools = f" | tool use {row['val_tool_use']:.2f}" if "val_tool_use" in row else ""
                log(
                    f"step {step:4d} | val_acc {row['val_acc']:.3f}{tools} | "
                    f"reward {row['reward']:.3f} | kl {row['ppo_kl']:+.1e} | "
                    f"gen {row['gen_samples_per_s']:.0f}/s | "
                    f"train {row['train_samples_per_s']:.0f}/s | {row['time_s']:.1f}s"
                )
                target = cfg.trainer.target_accuracy
                if target is not None and row["val_acc"] >= target:
                    log(f"reached val_acc {row['val_acc']:.3f} >= {target} at step {step}")
                    break
    finally:
        runner.close()
        scorer.close()
        engine.close()  # the process's one vLLM engine, where it is one
    return history


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(int(os.environ.get("ASYNCRL_TORCH_THREADS", "1")))
    args = sys.argv[1:]
    if {"-h", "--help"} & set(args):
        print(__doc__)
        sys.exit(0)
    config = None
    if args[:1] == ["--config"]:
        config, args = args[1], args[2:]
    main(load_config(config, args))
