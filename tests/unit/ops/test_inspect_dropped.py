"""``asyncrl inspect samples``: a sample the trainer dropped says why. Dynamic sampling's
filtered groups (99 of 308 samples of a run) showed as '-' under trained_at_step, alike with
those not trained yet, their reason on the control topic only. Over an in-memory broker."""

from __future__ import annotations

import pytest

import asyncrl.kafka.records as records
from asyncrl.config import load_config
from asyncrl.ops import inspect_log
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import TAG as SAMPLE_TAG
from asyncrl.schemas.sample import Sample, Trajectory, encode_sample
from asyncrl.schemas.step import TAG as STEP_TAG
from asyncrl.schemas.step import StepRecord, encode_step
from asyncrl.testing import MemoryBroker


def test_a_dropped_sample_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(overrides=["run_id=r"])
    broker = MemoryBroker()
    for sid in ("kept@0", "filtered@0", "waiting@0"):
        sample = Sample(sid, sid, 0, [1], "1", [Trajectory([3], [-0.1], 1.0)])
        broker.append("r.samples", sid, encode_sample(sample), {SCHEMA_HEADER: SAMPLE_TAG.encode()})
    step = StepRecord("r", 1, 0, 0.0, ["kept@0"], [0], [0])
    broker.append("r.steps", "r", encode_step(step), {SCHEMA_HEADER: STEP_TAG.encode()})
    reason = "filter_groups: every trajectory's score is 1 (advantage 0, no signal)"
    control = broker.control(cfg)
    control.publish(ev.SamplesDropped("r", 0, count=1, reason=reason, sample_ids=["filtered@0"]))

    def read(_cfg, _bootstrap, name, start=0, end=None, **_kw):
        return broker.topics.get(f"r.{name}", [])[start:end]

    monkeypatch.setattr(inspect_log, "read_records", read)
    monkeypatch.setattr(records, "read_records", read)  # the audit's read_control
    rows = {r["sample_id"]: r for r in inspect_log.topic_rows(cfg, "-", "samples")}
    assert rows["kept@0"]["trained_at_step"] == 1 and "dropped" not in rows["kept@0"]
    assert rows["filtered@0"]["trained_at_step"] is None
    assert rows["filtered@0"]["dropped"] == reason
    assert "dropped" not in rows["waiting@0"]  # not trained yet, not dropped
