"""`asyncrl audit` on a real run: clean as it ran, then it counts exactly the faults planted
on its topics, and the command exits 1."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from asyncrl.cli import main
from asyncrl.kafka import Publisher
from asyncrl.kafka.records import read_records
from asyncrl.launch.launcher import run
from asyncrl.launch.log_archive import Archiver
from asyncrl.ops.audit import audit_run
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas import control as ev
from asyncrl.schemas.step import TAG as STEP_TAG
from asyncrl.schemas.step import StepRecord, encode_step
from tests.helpers import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

STEPS = 3


def test_a_run_audits_clean_and_planted_faults_are_counted_exactly(
    make_run_cfg, quick_policy, capsys
):
    cfg = make_run_cfg(
        *quick_policy,
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.max_concurrent_samples=4",
        "async_training.staleness_threshold=0.5",
        f"trainer.total_training_steps={STEPS}",
        "trainer.test_freq=0",
    )
    bootstrap = cfg.kafka.bootstrap_servers
    with Publisher(cfg.kafka, bootstrap) as pub:  # dead-lettered by the trainer, not a fault
        pub.publish(cfg.topic("samples"), "junk", b"not arrow at all")
    assert run(cfg, Console(file=io.StringIO()))["step"] == STEPS

    clean = audit_run(cfg, bootstrap)
    assert clean.ok, clean.to_dict()
    assert clean.undecodable == {"samples": 1} and clean.info["dead_lettered"] == 1
    assert clean.info["steps"] == STEPS and clean.info["syncs_complete"] == STEPS - 1
    assert clean.info["versions"] == STEPS and clean.info["run_finished"] == 1
    assert clean.info["samples"] >= STEPS * 4 and clean.info["prompts_committed"] > 0
    # The command finds the run's resolved config (its broker, its budget) by run id.
    assert main(["audit", cfg.run_id, "--output-dir", cfg.output_dir, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True

    samples = [r for r in read_records(cfg, bootstrap, "samples") if r.key != "junk"]
    steps = [r.value for r in read_topic(cfg, "steps")]
    trained = {sid for s in steps for sid in s.sample_ids}
    untrained = [r for r in samples if r.key not in trained]
    twice = (untrained or samples)[0]
    with Publisher(cfg.kafka, bootstrap) as pub:
        copy = samples[0]  # a verbatim copy: key, bytes and headers
        pub.publish(cfg.topic("samples"), copy.key, copy.value, headers=copy.headers)
        other = ev.WeightsPublished(cfg.run_id, 1, checksum="0" * 64, incarnations=["planted"])
        pub.publish(
            cfg.topic("control"), cfg.run_id, ev.encode_event(other), {SCHEMA_HEADER: other.tag()}
        )
        record = StepRecord(
            cfg.run_id,
            steps[-1].step + 1,
            steps[-1].version,
            steps[-1].ts + 1,
            [twice.key, twice.key],
            [twice.partition] * 2,
            [twice.offset] * 2,
        )
        pub.publish(
            cfg.topic("steps"), str(record.step), encode_step(record), {SCHEMA_HEADER: STEP_TAG}
        )

    faulty = audit_run(cfg, bootstrap)
    planted = {
        "duplicate_samples": 1,
        "reused_versions": 1,  # version 1 now has two checksums
        "version_regressions": 1,  # and was published after version 2
        "trained_twice": 1 if untrained else 2,
    }
    assert {k: n for k, n in faulty.violations.items() if n} == planted
    assert faulty.examples["duplicate_samples"] == [copy.key]
    named = f"kafka.bootstrap_servers={bootstrap}"
    assert main(["audit", cfg.run_id, "--output-dir", cfg.output_dir, named]) == 1
    out = capsys.readouterr().out
    assert "duplicate_samples" in out and f"{sum(planted.values())} violations" in out

    # With the log archived (the embedded broker's runs), the command reads the archive.
    Archiver(cfg, bootstrap).start().stop()
    assert main(["audit", cfg.run_id, "--output-dir", cfg.output_dir, "--json"]) == 1
    offline = json.loads(capsys.readouterr().out)
    assert offline["violations"] == faulty.violations and offline["info"] == faulty.info

    # A run moved aside by the next run of its run_id (runs/<id>.<time>), or copied under
    # another name, is read from there under its own run_id (its name failed the run_id
    # pattern before, and a copy looked for the topics of its directory's name).
    import shutil

    for name in (f"{cfg.run_id}.20261126-120000", "copied"):
        moved = cfg.run_dir.parent / name
        shutil.copytree(cfg.run_dir, moved)
        assert main(["audit", str(moved), "--json"]) == 1
        assert json.loads(capsys.readouterr().out)["violations"] == faulty.violations
        assert main(["inspect", "steps", name, f"output_dir={cfg.output_dir}", "--json"]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
        assert [r["step"] for r in rows][:STEPS] == list(range(1, STEPS + 1))  # and planted
