"""A worker's refunds reach the budget that counted the dropped samples as stale.

A version's budget opens with the trainer's ``consumed`` as of that version's SyncRequested
(or, at a join, its welcome WeightsPublished): a drop logged before it is counted there as
consumed, one logged after it as stale. A refund given to the wrong budget is either lost
(the trainer starves: it waits for samples no worker may start) or given twice (the worker
starts more than the staleness bound lets the trainer train, and those are dropped in turn).
"""

from __future__ import annotations

import torch

from asyncrl.config import load_config
from asyncrl.producers.follower import SyncFollower
from asyncrl.schemas import control as ev
from asyncrl.testing import MemoryBroker
from tests.helpers import SMALL


class _Engine:
    def __init__(self) -> None:
        self.model = torch.nn.Linear(2, 2)

    def update_weights(self, load):
        return load(self.model)


class _Sink:
    """A weight transfer that is already in (the test is about the events around it)."""

    def await_transfer(self, waiting) -> None:
        pass

    def receive_into(self, model, bucket_bytes):
        return None


def _follower(tmp_path) -> tuple[SyncFollower, ev.ControlEvent, MemoryBroker]:
    cfg = load_config(
        overrides=[
            *SMALL,
            f"output_dir={tmp_path}",
            "run_id=mem",
            "actor_rollout_ref.rollout.num_workers=1",
            "async_training.staleness_threshold=0.5",  # 6 samples per version
            "sync.verify_checksum=false",
        ]
    )
    broker = MemoryBroker()
    control = broker.control(cfg, worker=0, incarnation="inc0")
    control.start()
    follower = SyncFollower(cfg, 0, "inc0", control, lambda device: _Sink(), _Engine())
    trainer = broker.control(cfg)
    return follower, trainer, broker


def _dropped(count: int, version: int) -> ev.SamplesDropped:
    return ev.SamplesDropped(run_id="mem", version=version, target_worker=0, count=count)


def test_a_drop_logged_after_the_next_request_refunds_that_versions_budget(tmp_path):
    """In-flight updates read the next version's SyncRequested, WeightsPublished and the
    trainer's drops before the swap opens the new budget: the refund must survive it."""
    f, trainer, _ = _follower(tmp_path)
    f.version = 8
    f.budget.reset(8, 0)
    f.handle(ev.SyncRequested(run_id="mem", version=9, consumed={"0": 10}))
    published = ev.WeightsPublished(run_id="mem", version=9, incarnations=["inc0"])
    f.handle(published)
    f.handle(_dropped(3, version=8))  # logged after SyncRequested(9): stale in 9's count
    assert f.budget.allowed == 6  # not version 8's: it would start them under the old weights
    f.version = 9
    f.resume(6, published)  # 6 stale: nothing left of the share of 6
    assert f.budget.allowed == 3


def test_a_drop_logged_before_the_next_request_refunds_at_once(tmp_path):
    f, _, _ = _follower(tmp_path)
    f.budget.reset(0, 4)
    f.handle(_dropped(2, version=0))
    assert f.budget.allowed == 4


def test_drops_logged_before_a_joins_welcome_refund_nothing(tmp_path):
    """The welcome's ``consumed`` counts them (the worker opens its budget without them as
    stale); drops logged after it refund as usual."""
    f, trainer, _ = _follower(tmp_path)
    f.sink = _Sink()
    trainer.publish(_dropped(2, version=5))
    trainer.publish(ev.WeightsPublished(run_id="mem", version=5, incarnations=["inc0"]))
    trainer.publish(_dropped(1, version=5))
    welcome = f.receive()
    assert welcome.version == 5
    f.resume(0, welcome)
    assert f.budget.allowed == 6
    f.poll(0.0)
    assert f.budget.allowed == 7
