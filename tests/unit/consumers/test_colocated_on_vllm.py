"""The colocated baseline on vLLM: vLLM holds its own copy of the weights, so each step's
rollouts come from the weights the previous step trained only if the loop loads them; its
held-out evaluation generates on that same engine (one vLLM engine per process), closed at
the end."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("vllm", reason="vllm not installed (make install VLLM=none)")

from asyncrl.config import load_config  # noqa: E402
from asyncrl.consumers.colocated import main as colocated  # noqa: E402
from asyncrl.producers.agent import eval_engine  # noqa: E402
from asyncrl.producers.engines.vllm_engine import live_engine  # noqa: E402


def test_each_step_samples_from_the_weights_the_last_step_trained(
    demo_policy, tmp_path, monkeypatch, caplog
):
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
    monkeypatch.setattr(eval_engine, "_LOGGED", set())  # logged once a process
    with caplog.at_level(logging.INFO, eval_engine.__name__):
        history = colocated(cfg, log=lambda _: None)
    gaps = [row["training/rollout_probs_diff_max"] for row in history[1:]]
    assert len(gaps) == 3
    assert max(gaps) < 1e-4, gaps
    assert all(row["actor/grad_norm"] > 0 for row in history[1:3])  # steps that moved them
    # step 0's and the last step's held-out evaluations ran on the loop's own engine
    assert "val_acc" in history[0] and "val_acc" in history[-1]
    assert "held-out evaluation generates on the loop's own vLLM engine" in caplog.text
    assert "engine" not in eval_engine._VLLM or eval_engine._VLLM["engine"].llm is None
    assert live_engine() is None  # closed when the loop ended
