"""A verl user's own model, data and reward (issue 19): a Hugging Face checkpoint directory, the
arithmetic task exported to verl's parquet format, and a ``compute_score`` file, trained on
through ``asyncrl run`` with verl's keys; held-out accuracy (the mean reward of greedy
answers to data.val_files) rises, and the reward function's failures are marked, not zeros.
The run takes the settings a real model needs: micro-batches by tokens, the hf_static engine."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from asyncrl.cli import main as cli
from asyncrl.config import load_config
from asyncrl.launch.launcher import run
from asyncrl.schemas import control as ev
from tests.helpers import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1 for the exact sum; every 25th training prompt's scorer breaks (a reward failure)."""
    if extra_info["split"] == "train" and extra_info["index"] % 25 == 0:
        raise RuntimeError("a flaky scorer")
    answer = solution_str.strip()
    return {"score": float(answer == ground_truth), "answered": float(answer.isdigit())}
'''


def _checkpoint(demo_policy: tuple[str, ...], out: Path) -> Path:
    """The demo's warm-started tiny policy saved as a Hugging Face checkpoint with a chat
    template (the messages' text after <bos>: the tokens it was warm-started on)."""
    from asyncrl.models.policy import TINY_CHAT_TEMPLATE
    from asyncrl.models.warm_start import load_policy

    model, tokenizer = load_policy(load_config(overrides=list(demo_policy)))
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_your_model_data_and_reward_learn(make_run_cfg, demo_policy, tmp_path, capsys):
    ckpt = _checkpoint(demo_policy, tmp_path / "my-model")
    assert cli(["export-data", "--out", str(tmp_path / "data")]) == 0
    assert "train: " in capsys.readouterr().out
    train, val = tmp_path / "data" / "train.parquet", tmp_path / "data" / "val.parquet"
    long = tmp_path / "data" / "long.parquet"  # over data.max_prompt_length after templating
    rows = [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"{'0' * 20}{i}+1="}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"split": "train", "index": 1 + 2000 + i},
        }
        for i in range(3)
    ]
    pq.write_table(pa.Table.from_pylist(rows), long)
    reward = tmp_path / "my_reward.py"
    reward.write_text(REWARD)

    cfg = make_run_cfg(
        f"actor_rollout_ref.model.path={ckpt}",
        f"data.train_files=[{train},{long}]",
        f"data.val_files={val}",
        f"custom_reward_function.path={reward}",
        "trainer.total_training_steps=60",
        "trainer.test_freq=10",
        "trainer.target_accuracy=null",
        # what a real model at real lengths runs with: micro-batches by tokens (~3 a step of
        # 64 trajectories here), the engine written for GPUs
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=256",
        "actor_rollout_ref.rollout.name=hf_static",
    )
    out = io.StringIO()
    summary = run(cfg, Console(file=out, width=200))
    log = out.getvalue()
    assert "loaded by each process, no warm start" in log
    assert "data: 2000 of the 2003 prompts in data.train_files (3 longer than" in log
    assert "data: 200 of the 200 prompts in data.val_files" in log
    assert "60/60" in log, "the progress shows the trainer's last step before the summary"

    initial, final = summary["val/accuracy_initial"], summary["val/accuracy"]
    print(f"\nheld-out accuracy {initial:.3f} -> {final:.3f} in {summary['step']} steps")
    assert initial < 0.6, f"the checkpoint should leave room for RL (initial {initial:.2f})"
    assert final - initial >= 0.15, f"held-out accuracy went {initial:.2f} -> {final:.2f}"

    samples = [r.value for r in read_topic(cfg, "samples")]
    assert all(s.prompt_id.startswith("0.train-") for s in samples)  # the long ones left out
    failed = [t for s in samples for t in s.trajectories if t.reward_failed]
    assert failed, "every 25th training prompt's reward raises"
    assert all(t.reward == 0.0 and "RuntimeError: a flaky scorer" in t.reward_error for t in failed)
    flaky = {s.sample_id for s in samples if int(s.prompt_id.rsplit("-", 1)[1]) % 25 == 0}
    assert {s.sample_id for s in samples if any(t.reward_failed for t in s.trajectories)} == flaky

    steps = [r.value for r in read_topic(cfg, "steps")]
    assert sum(s.metrics["reward/failures"] for s in steps) > 0
    assert all("reward/answered/mean" in s.metrics for s in steps)
    loaded = [r.value for r in read_topic(cfg, "control")]
    loaded = [e for e in loaded if isinstance(e, ev.WeightsLoaded)]
    assert loaded and all(e.checksum_ok for e in loaded), "the weight sync of the checkpoint"
