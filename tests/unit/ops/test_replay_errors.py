"""``asyncrl replay step N`` with settings that build another model than the checkpoint's:
one line naming the problem, not the 44-line state-dict traceback of torch."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from asyncrl.config import load_config
from asyncrl.ops import replay
from asyncrl.schemas.step import StepRecord


def test_a_checkpoint_that_does_not_fit_the_model_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(overrides=["run_id=r", f"output_dir='{tmp_path}'"])
    before = replay._ckpt(cfg, 4)
    before.mkdir(parents=True)
    torch.save(torch.nn.Linear(3, 3).state_dict(), before / "model.pt")  # the run's model
    record = StepRecord("r", 5, 1, 0.0, [], [], [])
    monkeypatch.setattr(replay, "find_step", lambda *_: record)
    monkeypatch.setattr(replay, "fetch_samples", lambda *_: [])
    import asyncrl.models.warm_start as warm_start

    other = (torch.nn.Linear(2, 2), SimpleNamespace(pad_token_id=0))  # what the settings build
    monkeypatch.setattr(warm_start, "load_policy", lambda _cfg, **_: other)
    with pytest.raises(replay.ReplayError) as err:
        replay.replay_step(cfg, "127.0.0.1:1", 5, Console())
    message = str(err.value)
    assert message.startswith("the checkpoint of step 4 does not load into the model these")
    assert "size mismatch for weight" in message and "\n" not in message


def test_a_step_not_on_the_log_names_the_steps_that_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """`replay step 21` of a 20-step run said only 'step 21 is not on w1.steps'."""
    from asyncrl.schemas import SCHEMA_HEADER
    from asyncrl.schemas.step import TAG, encode_step
    from asyncrl.testing import MemoryBroker

    cfg = load_config(overrides=["run_id=r"])
    broker = MemoryBroker()
    monkeypatch.setattr(replay, "read_records", lambda *_: broker.topics.get("r.steps", []))
    with pytest.raises(
        replay.ReplayError, match=r"^step 3 is not on r.steps \(it holds no step yet\)$"
    ):
        replay.find_step(cfg, "-", 3)
    for n in (1, 2):
        rec = encode_step(StepRecord("r", n, 0, 0.0, [], [], []))
        broker.append("r.steps", "r", rec, {SCHEMA_HEADER: TAG.encode()})
    with pytest.raises(
        replay.ReplayError, match=r"^step 21 is not on r.steps \(it holds steps 1-2\)$"
    ):
        replay.find_step(cfg, "-", 21)


def _replay_ids(
    monkeypatch: pytest.MonkeyPatch, ids: set[str]
) -> tuple[list[str], str, Exception | None]:
    """``replay_topic`` of r.samples (p0@0, p1@0) into run t, asking for ``ids``: the ids
    copied, what it printed and what it raised; a MemoryBroker in place of Kafka."""
    import contextlib
    import io

    import asyncrl.kafka as kafka
    import asyncrl.kafka.topics as topics
    from asyncrl.schemas import SCHEMA_HEADER
    from asyncrl.schemas.sample import TAG, decode_sample, encode_sample
    from asyncrl.testing import MemoryBroker
    from tests.unit.ops.test_audit import sample

    cfg = load_config(overrides=["run_id=r"])
    broker = MemoryBroker()
    for i in (0, 1):
        broker.append(
            "r.samples", f"p{i}", encode_sample(sample(i, 0)), {SCHEMA_HEADER: TAG.encode()}
        )
    monkeypatch.setattr(replay, "read_records", lambda *_, **__: list(broker.topics["r.samples"]))
    monkeypatch.setattr(topics, "create_run_topics", lambda *_: None)
    monkeypatch.setattr(kafka, "Publisher", lambda *_: contextlib.nullcontext(broker.publisher()))
    out = io.StringIO()
    raised = None
    try:
        replay.replay_topic(cfg, "-", "samples", "t", Console(file=out, width=200), sample_ids=ids)
    except replay.ReplayError as err:
        raised = err
    copied = [
        decode_sample(r.value, r.headers).sample_id for r in broker.topics.get("t.samples", [])
    ]
    return copied, out.getvalue(), raised


def test_sample_ids_not_on_the_topic_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """`replay topic samples --sample-ids p1@0,nope` copied p1@0 and said nothing of nope."""
    copied, printed, raised = _replay_ids(monkeypatch, {"p1@0", "nope", "gone"})
    assert copied == ["p1@0"] and raised is None
    assert printed.splitlines()[-1] == "2 of the sample ids asked not on r.samples: gone, nope"


def test_no_sample_id_found_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the ids on the topic: a copy of nothing that exited 0."""
    copied, _, raised = _replay_ids(monkeypatch, {"nope"})
    assert copied == [] and str(raised) == "none of the 1 sample ids asked is on r.samples: nope"
