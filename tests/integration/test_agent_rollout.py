"""The agent loop in a real run: a worker calls the calculator mid-generation, the trainer
trains on the model's tokens only, and syncs (mode d) log agent states that are continued."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from asyncrl.launch.launcher import run
from asyncrl.ops.inspect_log import inspect_topic
from asyncrl.producers.agent.state import AgentState, Phase
from tests.helpers import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

STEPS = 8
SETTINGS = [
    # A small warm start in which half the teacher's answers call the tool.
    "actor_rollout_ref.model.warmup_steps=150",
    "actor_rollout_ref.model.warmup_tool_prob=0.5",
    "actor_rollout_ref.model.hidden_size=64",
    "actor_rollout_ref.model.intermediate_size=128",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.max_concurrent_samples=2",
    "actor_rollout_ref.rollout.emulated_decode_latency_s=0.02",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "data.val_size=16",
    "trainer.test_freq=8",
    "trainer.target_accuracy=null",
    f"trainer.total_training_steps={STEPS}",
]


def test_a_calculator_run_calls_the_tool_and_trains_on_the_models_tokens_only(
    make_run_cfg, policy_dir
):
    cfg = make_run_cfg(
        f"actor_rollout_ref.model.cache_dir='{policy_dir}'", *SETTINGS, config="calculator"
    )
    assert cfg.async_training.mode == "d"
    summary = run(cfg, Console(file=io.StringIO(), width=160))
    assert summary["step"] == STEPS

    from asyncrl.models.warm_start import load_policy

    _, tok = load_policy(cfg)
    samples = [r.value for r in read_topic(cfg, "samples")]
    trajs = [t for s in samples for t in s.trajectories]
    called = [t for t in trajs if t.tool_calls]
    assert called, "no trajectory called the calculator"
    for t in called:
        # Tool responses are in the response with mask 0 and logprob 0; the rest is the model's.
        zeros = [i for i, m in enumerate(t.response_mask) if m == 0]
        assert zeros and all(t.response_logprobs[i] == 0.0 for i in zeros)
        tool_text = tok.decode([int(t.response_ids[i]) for i in zeros])
        assert tool_text.startswith("=")  # the calculator's answer as the compact format writes it
        assert t.num_turns >= 2 and 0 <= t.tool_errors <= t.tool_calls
        if t.tool_errors < t.tool_calls:  # a call that ran takes time; a malformed one never ran
            assert t.tool_s > 0
        assert all(lp <= 0 for lp in t.response_logprobs)
    direct = [t for t in trajs if not t.tool_calls]
    assert all(t.response_mask.tolist() == [1] * len(t.response_ids) for t in direct)

    # Syncs interrupted agents: their state is in the log, and each such sample was finished.
    partials = [r.value for r in read_topic(cfg, "partials")]
    states = [AgentState.from_json(a) for p in partials for a in p.agent_state if a]
    assert states and {s.phase for s in states} <= {Phase.GENERATING, Phase.PROCESSING_TOOLS}
    assert {p.sample.sample_id for p in partials} <= {s.sample_id for s in samples} | {
        sid for r in read_topic(cfg, "control") for sid in getattr(r.value, "sample_ids", [])
    }

    # asyncrl inspect shows the turns and tool calls, with the text of the conversation.
    out = io.StringIO()
    rows = inspect_topic(
        cfg, cfg.kafka.bootstrap_servers, "samples", Console(file=out), as_json=True, text=True
    )
    agentic = [r for r in rows if "turns" in r]
    assert agentic and all(r["tool_calls"] > 0 for r in agentic)
    assert any("[" in resp and "]=" in resp for r in agentic for resp in r["responses"])

    # The trainer reported the agent metrics and the held-out tool use.
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "agent/tool_use_rate" in r]
    assert len(steps) == STEPS
    assert all(0 <= r["agent/tool_use_rate"] <= 1 for r in steps)
    assert any(r["agent/tool_calls/mean"] > 0 for r in steps)
    assert 0 <= summary["val/tool_use"] <= 1 and 0 <= summary["val/tool_use_initial"] <= 1
