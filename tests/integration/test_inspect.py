"""`asyncrl inspect` reads a finished run's topics back from the broker."""

from __future__ import annotations

import io
import json
from datetime import datetime, timedelta, timezone

import pytest
from rich.console import Console

from asyncrl.consumers.trainer import Trainer
from asyncrl.kafka import Publisher
from asyncrl.launch.launcher import run
from asyncrl.ops.inspect_log import inspect_topic, parse_time
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas.sample import TAG, encode_sample
from tests.integration.test_trainer_restart import TRAINER_ALONE, synthetic_sample

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _rows(cfg, topic: str, **kw) -> list[dict]:
    out = io.StringIO()
    inspect_topic(cfg, cfg.kafka.bootstrap_servers, topic, Console(file=out), as_json=True, **kw)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_inspect_samples_control_steps_and_dead_letter(make_run_cfg, quick_policy):
    cfg = make_run_cfg(
        *quick_policy,
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=3",
        "trainer.test_freq=0",
    )
    with Publisher(cfg.kafka, cfg.kafka.bootstrap_servers) as pub:
        pub.publish(cfg.topic("samples"), "junk", b"not arrow at all")
    run(cfg, Console(file=io.StringIO()))

    samples = _rows(cfg, "samples", text=True)
    assert samples[0]["offset"] == 0 and "decode_error" in samples[0]
    good = [r for r in samples if "sample_id" in r]
    trained = [r for r in good if r["trained_at_step"] is not None]
    assert len(trained) == 3 * 4
    assert all(r["staleness"] >= 0 for r in trained)
    assert all(isinstance(r["prompt"], str) and r["prompt"].endswith("=") for r in good)

    window = _rows(cfg, "samples", start=2, end=4)
    assert [r["offset"] for r in window] == [2, 3]

    # --json rows carry the date and zone (a table shows the time of day alone), and a row's
    # time given back to --since starts the listing at that row
    last = datetime.fromisoformat(good[-1]["time"])
    assert last.tzinfo is not None
    assert abs(datetime.now(timezone.utc) - last) < timedelta(hours=1)
    since = _rows(cfg, "samples", since_ms=parse_time(good[-1]["time"]))
    assert good[-1]["offset"] in [r["offset"] for r in since]
    assert all(datetime.fromisoformat(r["time"]) >= last for r in since)

    control = _rows(cfg, "control")
    syncs = [r["version"] for r in control if r["event"] == "SyncRequested"]
    assert syncs == [1, 2]
    assert any(r["event"] == "RunFinished" for r in control)

    steps = _rows(cfg, "steps")
    assert [r["step"] for r in steps] == [1, 2, 3]
    # --json: every metric of the step, and the samples it trained where they were on the log
    for r in steps:
        assert r["metrics"]["critic/score/mean"] == r["reward"] and "actor/lr" in r["metrics"]
        at = {(t["sample_id"], t["offset"]) for t in r["samples_trained"]}
        assert at == {
            (x["sample_id"], x["offset"]) for x in trained if x["trained_at_step"] == r["step"]
        }

    [dead] = _rows(cfg, "dead-letter")
    assert dead["source"] == f"{cfg.topic('samples')}[0]@0"  # topic[partition]@offset
    assert "Arrow" in dead["error"]


def test_inspect_marks_the_steps_a_trainer_restart_voided(make_run_cfg, quick_policy):
    """A trainer died after step 3 with its checkpoint of step 2; the next one trained step 3
    again on the same samples. Both step 3 records are on the log: the first is marked void,
    and a sample of that step was trained at the step in force."""
    cfg = make_run_cfg(
        *quick_policy,
        *TRAINER_ALONE,
        "trainer.total_training_steps=4",
        "trainer.save_freq=2",
        "sync.timeout_s=1",
    )

    def publish(ids: range) -> None:
        with Publisher(cfg.kafka, cfg.kafka.bootstrap_servers) as pub:
            for i in ids:
                sample = encode_sample(synthetic_sample(i))
                pub.publish(cfg.topic("samples"), f"s{i}", sample, {SCHEMA_HEADER: TAG})

    publish(range(12))  # three steps' worth: the first trainer waits in vain for a fourth
    first = Trainer(cfg, cfg.kafka.bootstrap_servers)
    try:
        with pytest.raises(TimeoutError, match="samples arrived"):
            first.run()
    finally:
        first.close()
    publish(range(12, 16))
    second = Trainer(cfg, cfg.kafka.bootstrap_servers)
    try:
        assert second.step == 2
        assert second.run()["step"] == 4
    finally:
        second.close()

    steps = _rows(cfg, "steps")
    assert [(r["step"], r.get("void", False)) for r in steps] == [
        (1, False),
        (2, False),
        (3, True),
        (3, False),
        (4, False),
    ]
    at = {r["sample_id"]: r["trained_at_step"] for r in _rows(cfg, "samples")}
    assert at["s8"] == 3 and at["s15"] == 4
    out = io.StringIO()
    inspect_topic(cfg, cfg.kafka.bootstrap_servers, "steps", Console(file=out, width=200))
    assert "void: a trainer restart lost this step's update" in out.getvalue()


def test_inspect_of_an_empty_topic_says_so(run_cfg):
    out = io.StringIO()
    rows = inspect_topic(
        run_cfg, run_cfg.kafka.bootstrap_servers, "partials", Console(file=out, width=120)
    )
    assert rows == []
    assert out.getvalue().strip() == f"{run_cfg.topic('partials')}: no records"
