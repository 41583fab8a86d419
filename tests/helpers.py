"""Small helpers shared by the tests: read a whole topic back, build samples, check logprobs."""

from __future__ import annotations

import sys
import time
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.kafka import Reader, Record, count_records, raw_decode
from asyncrl.schemas import control, partial, prompt, sample, step

SMALL = [
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.max_concurrent_samples=4",
    "trainer.test_freq=0",
    "async_training.trigger_parameter_sync_step=1",
]
"""A run small enough for protocol tests: groups of 4, 4 samples a step, no evaluation, a
sync after every step."""

SMALL_MODEL = [
    "actor_rollout_ref.model.hidden_size=16",
    "actor_rollout_ref.model.num_hidden_layers=1",
    "actor_rollout_ref.model.num_attention_heads=2",
    "actor_rollout_ref.model.intermediate_size=32",
]
"""The demo policy's shape cut to one layer of width 16, for tests that need a real model
but not its size (eight test files spelled the four keys out)."""

DECODERS = {
    "samples": sample.decode_sample,
    "control": control.decode_event,
    "steps": step.decode_step,
    "prompts": prompt.decode_prompt,
    "partials": partial.decode_partial,
    "dead-letter": raw_decode,
}


def read_topic(cfg: RunConfig, name: str, timeout_s: float = 20.0) -> list[Record[Any]]:
    """Every record of the run's topic ``name`` that decodes, in offset order per partition
    (records that do not decode are skipped: fault tests put some there)."""
    bootstrap = cfg.kafka.bootstrap_servers
    topic = cfg.topic(name)
    expected = count_records(cfg.kafka, bootstrap, topic)
    out: list[Record[Any]] = []
    with Reader(cfg.kafka, bootstrap, DECODERS[name]) as reader:
        reader.assign(topic)
        deadline = time.monotonic() + timeout_s
        while len(out) + reader.dropped < expected and time.monotonic() < deadline:
            out.extend(reader.poll(0.2))
        got = len(out) + reader.dropped
    assert got == expected, f"read {got} of {expected} records of {topic}"
    return out


def _errors(cfg: RunConfig, state_dict: dict, rows: list[tuple]) -> Any:
    """|rollout logprob - logprob recomputed with ``state_dict``|, ``[B, R]``, of ``rows``."""
    from asyncrl.consumers.grpo import rollout_logprob_errors
    from asyncrl.models.warm_start import load_policy

    model, tokenizer = load_policy(cfg)
    model.load_state_dict(state_dict)
    temperature = cfg.actor_rollout_ref.rollout.temperature
    return rollout_logprob_errors(model, rows, tokenizer.pad_token_id, temperature)


def sample_logprob_error(cfg: RunConfig, state_dict: dict, s: sample.Sample) -> float:
    """Max |rollout logprob - logprob recomputed with ``state_dict``| over a sample's tokens."""
    rows = [(s.prompt_ids, t.response_ids, t.response_logprobs, 0.0) for t in s.trajectories]
    return float(_errors(cfg, state_dict, rows).max())


def token_logprob_errors(
    cfg: RunConfig, state_dict: dict, prompt_ids: list[int], traj: sample.Trajectory
) -> list[float]:
    """|rollout logprob - logprob recomputed with ``state_dict``| for each response token."""
    rows = [(prompt_ids, traj.response_ids, traj.response_logprobs, 0.0)]
    return _errors(cfg, state_dict, rows)[0, : len(traj.response_ids)].tolist()


def committed_prompt_ids(cfg: RunConfig) -> set[str]:
    """Sample ids of the prompts the workers' group has committed (taken and accounted for)."""
    prompts = read_topic(cfg, "prompts")
    topic = cfg.topic("prompts")
    with Reader(
        cfg.kafka, cfg.kafka.bootstrap_servers, raw_decode, group_id=f"{cfg.run_id}.rollout"
    ) as group:
        committed = group.committed([(topic, p) for p in {r.partition for r in prompts}])
    return {
        r.value.sample_id for r in prompts if r.offset < (committed.get((topic, r.partition)) or 0)
    }


def report_recovery(cfg, scenario: str, fault_ts: float) -> float:
    """Seconds from the fault to the first step trained after it; printed (run with -s to
    collect the figures for the docs)."""
    after = [r.value.ts for r in read_topic(cfg, "steps") if r.value.ts > fault_ts]
    took = min(after) - fault_ts
    print(f"RECOVERY {scenario}: {took:.1f} s to the next step", file=sys.__stderr__)
    return took


def check_log_invariants(cfg) -> dict[str, int]:
    """``asyncrl audit``'s verdict on the run's log: every violation count 0. Returns the
    counts shown beside them (void steps, restarts, ...)."""
    from asyncrl.ops.audit import audit_run

    report = audit_run(cfg, cfg.kafka.bootstrap_servers)
    assert report.ok, {k: (n, report.examples.get(k)) for k, n in report.violations.items() if n}
    assert report.info["samples"] > 0 and report.info["prompts_committed"] > 0
    return report.info


PARITY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
    """Every third prompt scores 0 whatever the answer (a group with no signal, filtered);
    the others by the response's length parity (a signal in most groups)."""
    if int(ground_truth) % 3 == 0:
        return 0.0
    return float(len(solution_str) % 2)
'''


def parity_reward(tmp_path: Any) -> str:
    """``custom_reward_function.path`` of ``PARITY_REWARD``: dynamic sampling filters a share
    of the groups whatever the policy (the tiny model's early answers are mostly all wrong)."""
    path = tmp_path / "parity_reward.py"
    path.write_text(PARITY_REWARD)
    return f"custom_reward_function.path={path}"


def on_session_broker(bootstrap: str) -> tuple[str, ...]:
    """Overrides that point a run at the session's embedded Tansu, with the group session
    timeout ``asyncrl run`` gives the Tansu it starts (EMBEDDED_SESSION_TIMEOUT_MS): Tansu
    answers a group join after about half of it, so a run pointed at it as at any broker
    (6 s) waited ~3 s for its prompts at every worker start, ~2 s more than `make run`."""
    from asyncrl.config import EMBEDDED_SESSION_TIMEOUT_MS

    return (
        f"kafka.bootstrap_servers='{bootstrap}'",
        f"kafka.session_timeout_ms={EMBEDDED_SESSION_TIMEOUT_MS}",
    )
