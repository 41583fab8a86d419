"""The FSDP2 backend (consumers/fsdp_update.py): two gloo ranks on the CPU, real processes.

Rank 0 sends each step's samples to rank 1 (``broadcast_samples``); a 2-rank step on them leaves the same weights as the one-process step on it (float32
rounding apart: the ranks' gradients add up in another order), and reports the same loss."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.multiprocessing as mp

from asyncrl.config import RunConfig, load_config
from asyncrl.schemas.sample import Sample, Trajectory
from tests.helpers import SMALL_MODEL

VOCAB = 12
STEPS = 2


def _cfg() -> RunConfig:
    return load_config(
        overrides=[
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "async_training.require_batches=2",
            "data.max_prompt_length=5",
            "data.max_response_length=6",
            *SMALL_MODEL,
        ]
    )


def _samples() -> list[Sample]:
    """Eight groups of two trajectories of unequal lengths (the token-mean norm differs per
    rank) and rewards that differ within each group (every advantage non-zero)."""
    out = []
    for i in range(8):
        prompt = [3 + (i + k) % (VOCAB - 3) for k in range(2 + i % 4)]
        trajs = [
            Trajectory(
                response_ids=[3 + (i * 7 + k * 3 + j) % (VOCAB - 3) for k in range(n)],
                response_logprobs=[-1.5] * n,
                reward=float(j == i % 2),
                param_version_start=0,
                param_version=0,
            )
            for j, n in enumerate((1 + i % 6, 6 - i % 5))
        ]
        out.append(Sample(f"s{i}", f"p{i}", 0, prompt, "0", trajs))
    return out


def _policy(cfg: RunConfig) -> tuple[torch.nn.Module, object]:
    from asyncrl.models.tiny import build_model

    class Tokenizer:
        pad_token_id = 0

    return build_model(cfg.actor_rollout_ref.model, VOCAB, seed=0), Tokenizer()


def _rank(rank: int, world: int, out: str) -> None:
    import torch.distributed as dist

    from asyncrl.consumers.fsdp_update import FsdpUpdate, broadcast_samples

    init = f"file://{out}/rendezvous"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        cfg = _cfg()
        backend = FsdpUpdate(cfg, policy=_policy(cfg))
        metrics = []
        for step in range(1, STEPS + 1):  # rank 0 has the step's samples; rank 1 gets them
            samples = broadcast_samples(_samples() if rank == 0 else None)
            metrics.append(backend.step(samples, step, version=0))
        weights = backend.full_state_dict()
        if rank == 0:
            torch.save(weights, f"{out}/weights.pt")
            Path(out, "metrics.json").write_text(json.dumps(metrics))
    finally:
        dist.destroy_process_group()


def test_a_two_rank_step_leaves_the_one_rank_steps_weights(tmp_path):
    from asyncrl.consumers.local_update import LocalUpdate

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_rank, args=(2, str(tmp_path)), nprocs=2, start_method="spawn")
    cfg = _cfg()
    one = LocalUpdate(cfg, policy=_policy(cfg))
    expected = [one.step(_samples(), step, version=0) for step in range(1, STEPS + 1)]
    two = torch.load(tmp_path / "weights.pt", weights_only=True)
    ref = one.model.state_dict()
    assert set(two) == set(ref)
    start = _policy(cfg)[0].state_dict()
    moved = max(float((ref[k] - start[k]).abs().max()) for k in ref)
    diff = max(float((two[k] - ref[k]).abs().max()) for k in ref)
    print(f"max |2-rank - 1-rank| = {diff:.3g} (the step moved weights by up to {moved:.3g})")
    assert moved > 1e-4  # the steps trained: a match of untouched weights would prove nothing
    assert diff < 1e-5
    got = json.loads((tmp_path / "metrics.json").read_text())
    for mine, theirs in zip(got, expected, strict=True):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean"):
            assert abs(mine[key] - theirs[key]) < 1e-4, key
