"""The colocated baseline on vLLM: vLLM holds its own copy of the weights, so each step's
rollouts come from the weights the previous step trained only if the loop loads them."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm not installed (make install VLLM=none)")

from asyncrl.config import load_config  # noqa: E402
from asyncrl.consumers.colocated import main as colocated  # noqa: E402


def test_each_step_samples_from_the_weights_the_last_step_trained(demo_policy, tmp_path):
    """verl's training/rollout_probs_diff_max compares the rollout's logprobs with the
    trainer's recomputation under the weights it trains: float noise at every step, the
    first included, only if each update reaches vLLM before the next rollout.

    The demo's data section as it ships (no ``data.val_size`` of its own): the warm start's
    cache key covers ``data``, so any change there built a second 1500-step warm start (~90 s
    of the suite) where the session's demo policy serves."""
    cfg = load_config(
        None,
        [
            *demo_policy,
            f"output_dir='{tmp_path}'",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.enforce_eager=true",
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.optim.lr=0.003",  # steps that move the logprobs far
            "async_training.use_rollout_log_probs=false",  # the trainer recomputes them
            "trainer.total_training_steps=3",
            "trainer.test_freq=0",
            "trainer.target_accuracy=null",
        ],
    )
    history = colocated(cfg, log=lambda _: None)
    gaps = [row["training/rollout_probs_diff_max"] for row in history[1:]]
    assert len(gaps) == 3
    assert max(gaps) < 1e-4, gaps
    assert all(row["actor/grad_norm"] > 0 for row in history[1:3])  # steps that moved them
