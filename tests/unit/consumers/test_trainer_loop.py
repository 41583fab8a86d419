"""The trainer's loop and its sync coordinator, broker-free: over ``asyncrl.testing``'s in-memory
broker and weight transport (the same code paths as over Kafka and the collective; the broker
tests in tests/integration cover those)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.consumers.coordinator import SyncCoordinator
from asyncrl.consumers.trainer import Trainer
from asyncrl.producers.budget import worker_share
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import TAG as SAMPLE_TAG
from asyncrl.schemas.sample import Sample, Trajectory, encode_sample
from asyncrl.schemas.step import decode_step
from asyncrl.telemetry.metrics import WaitClock
from asyncrl.testing import LocalWeights, MemoryBroker, trainer_io
from tests.helpers import SMALL

WARM = ["actor_rollout_ref.model.warmup_steps=100"]


def _cfg(tmp_path, *overrides):
    return load_config(
        overrides=[*SMALL, *WARM, f"output_dir={tmp_path}", "run_id=mem", *overrides]
    )


def _publish_group(broker, cfg, prompt: int, version: int, worker: int = 0) -> list[str]:
    """A group of ``n`` samples of one prompt (rewards 0 and 1, so GRPO has a signal)."""
    ids = []
    n = cfg.actor_rollout_ref.rollout.n
    for i in range(n):
        trajectory = Trajectory(
            [5, 6, 2],
            [-0.5, -0.4, -0.3],
            float(i % 2),
            param_version=version,
            param_version_start=version,
        )
        sample = Sample(f"p{prompt}-{i}", f"p{prompt}", worker, [1, 7, 8], "3", [trajectory])
        broker.publisher().publish(
            cfg.topic("samples"),
            sample.sample_id,
            encode_sample(sample),
            headers={SCHEMA_HEADER: SAMPLE_TAG},
        )
        ids.append(sample.sample_id)
    return ids


def _trainer_at_version_3(tmp_path, max_version_lag: int):
    """A one-step trainer with no worker, started above version 2, which an earlier trainer
    published: it trains at version 3."""
    cfg = _cfg(
        tmp_path,
        f"async_training.max_version_lag={max_version_lag}",
        "trainer.total_training_steps=1",
        "actor_rollout_ref.rollout.num_workers=0",
    )
    broker = MemoryBroker()
    broker.control(cfg).publish(
        ev.WeightsPublished(run_id=cfg.run_id, version=2, step=4, checksum="")
    )
    trainer = Trainer(cfg, io=trainer_io(cfg, broker, weights=None))
    assert trainer.version == 3
    return cfg, broker, trainer


def test_a_trainer_step_filters_stale_samples_and_logs_the_step(tmp_path):
    cfg, broker, trainer = _trainer_at_version_3(tmp_path, max_version_lag=1)
    stale = _publish_group(broker, cfg, prompt=0, version=1)  # 3 - 1 > max_version_lag
    fresh = _publish_group(broker, cfg, prompt=1, version=2)
    summary = trainer.run()
    trainer.close()

    (step,) = [decode_step(r.value, r.headers) for r in broker.topics[cfg.topic("steps")]]
    assert step.sample_ids == fresh and step.version == 3
    dropped = [e for e in broker.events(cfg) if isinstance(e, ev.SamplesDropped)]
    assert sorted(i for e in dropped for i in e.sample_ids) == sorted(stale)
    assert all(e.target_worker == 0 for e in dropped)  # the worker's budget is refunded
    assert summary["dropped"] == {"max_version_lag": 4} and summary["step"] == 1
    kinds = [type(e).__name__ for e in broker.events(cfg)]
    assert kinds[1] == "TrainerResumed" and kinds[-1] == "RunFinished"


def test_a_sample_that_aged_past_the_lag_in_the_queue_is_dropped_not_trained(tmp_path):
    """max_version_lag was checked as a sample arrived: one queued at version 3 and trained
    after a sync, at 4, passed max_version_lag=0 (a run trained whole steps of samples a
    version old). Found by a tuning walkthrough: the trainer drops it as the step is
    assembled, with its SamplesDropped (budget refunded), and trains the fresh one."""
    cfg, broker, trainer = _trainer_at_version_3(tmp_path, max_version_lag=0)
    aged = _publish_group(broker, cfg, prompt=0, version=3)
    trainer._read_samples(0.5)  # queued at version 3: lag 0
    assert len(trainer.batcher) == len(aged)
    trainer.coordinator.version = 4  # as a sync does, before the sample's step
    fresh = _publish_group(broker, cfg, prompt=1, version=4)
    trainer.run()
    trainer.close()

    (step,) = [decode_step(r.value, r.headers) for r in broker.topics[cfg.topic("steps")]]
    assert step.sample_ids == fresh
    dropped = [e for e in broker.events(cfg) if isinstance(e, ev.SamplesDropped)]
    assert sorted(i for e in dropped for i in e.sample_ids) == sorted(aged)
    assert all(e.target_worker == 0 and "(queued)" in e.reason for e in dropped)


def test_a_mode_c_sync_waits_for_the_pause_then_sends_the_weights(tmp_path):
    # Step 2 trains the 4 samples of version 0 under version 1: a window's whole stale share
    # at staleness_threshold=1 (consumers/staleness_guard.py drops past it).
    cfg = _cfg(
        tmp_path,
        "trainer.total_training_steps=2",
        "sync.master_port=1",
        "async_training.staleness_threshold=1",
    )
    broker = MemoryBroker()
    weights = LocalWeights()
    worker = weights.sink(0)
    trainer = Trainer(cfg, io=trainer_io(cfg, broker, weights))
    worker_control = broker.control(cfg, worker=0, incarnation="inc-a")

    def scripted_worker(record) -> None:
        """Pauses when asked, as a worker in mode (c) with nothing in flight does."""
        if record.topic == cfg.topic("control"):
            event = ev.decode_event(record.value, record.headers)
            if isinstance(event, ev.SyncRequested):
                worker_control.publish(
                    ev.RolloutPaused(run_id=cfg.run_id, version=event.version, worker=0)
                )

    broker.reactions.append(scripted_worker)
    worker_control.publish(ev.WorkerStarted(run_id=cfg.run_id, version=0, worker=0))
    _publish_group(broker, cfg, prompt=0, version=0)
    _publish_group(broker, cfg, prompt=1, version=0)
    trainer.run()

    events = broker.events(cfg)
    kinds = [type(e).__name__ for e in events]
    request = kinds.index("SyncRequested")
    assert kinds[request : request + 3] == ["SyncRequested", "RolloutPaused", "WeightsPublished"]
    published = [e for e in events if isinstance(e, ev.WeightsPublished)]
    assert [(e.version, e.incarnations) for e in published] == [(0, ["inc-a"]), (1, ["inc-a"])]
    assert published[1].pause_wait_s < 1.0  # the pause was there at the first poll
    assert weights.sent == [[0], [0]]  # at the join, then at the sync
    sent = worker.sent[-1]
    trained = trainer.model.state_dict()
    # The sync sent the weights after step 1 (the trainer has done step 2 since).
    assert set(sent) == set(trained) and trainer.step == 2
    trainer.close()


def test_a_worker_joining_after_an_update_gets_a_new_version_not_the_old_number(tmp_path):
    """With local updates between syncs (trigger_parameter_sync_step=2), a worker that joins
    after step 1 (a restarted worker, or the workers' rejoin after a trainer restart) must not
    get the updated weights under version 0, which the other worker holds as they were: the
    trainer syncs version 1 at once, the joiner counted as paused. Each version names one set
    of weights (``asyncrl audit``: reused_versions)."""
    cfg = _cfg(
        tmp_path,
        "trainer.total_training_steps=2",
        "async_training.trigger_parameter_sync_step=2",
        "actor_rollout_ref.rollout.num_workers=2",
        "sync.master_port=1",
    )
    broker = MemoryBroker()
    weights = LocalWeights()
    weights.sink(0)
    joiner = weights.sink(1)
    trainer = Trainer(cfg, io=trainer_io(cfg, broker, weights))
    control = {w: broker.control(cfg, worker=w, incarnation=f"i{w}") for w in (0, 1)}

    def scripted(record) -> None:
        """Worker 0 pauses when asked; worker 1 starts once step 1 is on the log, and the
        samples of step 2 follow."""
        if record.topic == cfg.topic("control"):
            event = ev.decode_event(record.value, record.headers)
            if isinstance(event, ev.SyncRequested):
                control[0].publish(
                    ev.RolloutPaused(run_id=cfg.run_id, version=event.version, worker=0)
                )
        elif record.topic == cfg.topic("steps") and decode_step(record.value).step == 1:
            control[1].publish(ev.WorkerStarted(run_id=cfg.run_id, version=0, worker=1))
            _publish_group(broker, cfg, prompt=1, version=0)

    broker.reactions.append(scripted)
    control[0].publish(ev.WorkerStarted(run_id=cfg.run_id, version=0, worker=0))
    _publish_group(broker, cfg, prompt=0, version=0)  # a step's samples: the group of one
    trainer.run()

    published = [e for e in broker.events(cfg) if isinstance(e, ev.WeightsPublished)]
    checksums: dict[int, set[str]] = {}
    for e in published:
        checksums.setdefault(e.version, set()).add(e.checksum)
    assert all(len(c) == 1 for c in checksums.values()), checksums
    assert [(e.version, e.incarnations) for e in published] == [(0, ["i0"]), (1, ["i0", "i1"])]
    assert weights.sent == [[0], [0, 1]]  # worker 1's first weights came with version 1
    assert joiner.sent and trainer.step == 2
    trainer.close()


def test_workers_join_and_leave_the_coordinator(tmp_path):
    cfg = _cfg(tmp_path, "actor_rollout_ref.rollout.num_workers=2")
    broker = MemoryBroker()
    weights = LocalWeights()
    for w in (0, 1):
        weights.sink(w)
    rows: list[dict] = []
    coordinator = _coordinator(cfg, broker, rows)
    coordinator.sender = weights
    coordinator.control.start()
    worker = {w: broker.control(cfg, worker=w, incarnation=f"i{w}") for w in (0, 1)}
    for w in (0, 1):
        worker[w].publish(ev.WorkerStarted(run_id=cfg.run_id, version=0, worker=w))
    worker[0].publish(ev.WorkerStarted(run_id=cfg.run_id, version=0, worker=0))  # repeated
    coordinator.handle_control()
    assert coordinator.members == {0: "i0", 1: "i1"}
    assert weights.sent == [[0], [1]]  # each got the weights once, at its join
    assert coordinator.first_join is not None

    # Worker 0 delivered 1 sample of version 0, then stops: the rest of its share goes to 1.
    coordinator.received[(0, 0)] = 1
    worker[0].publish(
        ev.WorkerStopped(run_id=cfg.run_id, version=0, worker=0, reason="stopped", produced=3)
    )
    coordinator.handle_control()
    assert coordinator.members == {1: "i1"}
    (grant,) = [e for e in broker.events(cfg) if isinstance(e, ev.BudgetGranted)]
    share = worker_share(cfg.max_samples_per_version, 2, 0)
    assert share > 1 and (grant.target_worker, grant.count) == (1, share - 1)

    # A new incarnation of worker 1 replaces the old one and gets the weights again.
    broker.control(cfg, worker=1, incarnation="i1b").publish(
        ev.WorkerStarted(run_id=cfg.run_id, version=0, worker=1)
    )
    coordinator.handle_control()
    assert coordinator.members == {1: "i1b"} and weights.sent[-1] == [1]


def _publish_sample(broker, cfg, prompt: int, rewards: list[float], worker: int = 0) -> str:
    """One sample: a prompt's group of len(rewards) trajectories."""
    trajs = [Trajectory([5, 6, 2], [-0.5, -0.4, -0.3], r) for r in rewards]
    sample = Sample(f"g{prompt}", f"g{prompt}", worker, [1, 7, 8], "3", trajs)
    broker.publisher().publish(
        cfg.topic("samples"), sample.sample_id, encode_sample(sample), {SCHEMA_HEADER: SAMPLE_TAG}
    )
    return sample.sample_id


def test_dynamic_sampling_fills_the_batch_past_groups_without_signal(tmp_path):
    """filter_groups: the step is formed of the first 4 groups with a signal; the 3 groups
    between them whose rewards are all equal are logged as filtered. They refund no one (their
    worker took each slot back as it published it) and are not counted as consumed."""
    cfg = _cfg(
        tmp_path,
        "algorithm.filter_groups.enable=true",
        "trainer.total_training_steps=1",
        "actor_rollout_ref.rollout.num_workers=0",
    )
    broker = MemoryBroker()
    trainer = Trainer(cfg, io=trainer_io(cfg, broker, weights=None))
    plan = [[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0], [1, 1, 0, 1], [0, 0, 0, 0]]
    plan += [[0, 0, 1, 0], [1, 1, 1, 1]]
    ids = [_publish_sample(broker, cfg, i, [float(r) for r in rw]) for i, rw in enumerate(plan)]
    summary = trainer.run()
    trainer.close()

    (step,) = [decode_step(r.value, r.headers) for r in broker.topics[cfg.topic("steps")]]
    assert step.sample_ids == [ids[1], ids[3], ids[4], ids[6]]
    assert step.metrics["filter_groups/filtered_groups"] == 3.0  # g0, g2, g5; g7 comes after
    assert step.metrics["train/num_gen_batches"] == 2.0  # 7 read for a step of 4
    dropped = [e for e in broker.events(cfg) if isinstance(e, ev.SamplesDropped)]
    assert [i for e in dropped for i in e.sample_ids] == [ids[0], ids[2], ids[5], ids[7]]
    assert all(e.target_worker == ev.TRAINER for e in dropped)
    assert all(e.reason.startswith("filter_groups") for e in dropped)
    assert summary["filtered"] == 4 and summary["dropped"] == {}
    assert trainer.batcher.consumed == {0: 4}  # the 4 trained


def test_dynamic_sampling_fails_as_dapo_past_max_num_gen_batches(tmp_path):
    import pytest

    cfg = _cfg(
        tmp_path,
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=2",
        "trainer.total_training_steps=1",
        "actor_rollout_ref.rollout.num_workers=0",
    )
    broker = MemoryBroker()
    trainer = Trainer(cfg, io=trainer_io(cfg, broker, weights=None))
    _publish_sample(broker, cfg, 0, [1.0, 0.0])
    for i in range(1, 8):  # 1 kept + 7 filtered = 8 read = 2 batches of 4, still short
        _publish_sample(broker, cfg, i, [1.0, 1.0])
    with pytest.raises(RuntimeError, match="max_num_gen_batches=2: step 1 read 8 samples"):
        trainer.run()
    trainer.close()


def test_rollout_side_evaluations_reach_the_step_rows_and_stop_the_run_at_the_target(tmp_path):
    cfg = _cfg(
        tmp_path,
        "async_training.use_trainer_do_validate=false",
        "trainer.test_freq=1",
        "trainer.target_accuracy=0.8",
        "trainer.total_training_steps=3",
        "actor_rollout_ref.rollout.num_workers=0",
    )
    broker = MemoryBroker()
    trainer = Trainer(cfg, io=trainer_io(cfg, broker, weights=None))
    control = broker.control(cfg, worker=0)
    # Worker 0 evaluated version 0 (step 0: the initial accuracy) and the weights of step 1.
    control.publish(ev.Validated(run_id=cfg.run_id, version=0, step=0, accuracy=0.4))
    control.publish(ev.Validated(run_id=cfg.run_id, version=1, step=1, accuracy=0.85))
    for prompt in range(3):
        _publish_group(broker, cfg, prompt=prompt, version=0)
    summary = trainer.run()
    trainer.close()

    (step,) = [decode_step(r.value, r.headers) for r in broker.topics[cfg.topic("steps")]]
    assert step.metrics["val/accuracy"] == 0.85 and step.metrics["val/version"] == 1.0
    assert step.metrics["val/accuracy_initial"] == 0.4  # a killed run's report reads it here
    assert summary["reason"] == "target accuracy 0.80 reached" and summary["step"] == 1
    assert summary["val/accuracy_initial"] == 0.4 and summary["val/accuracy"] == 0.85


def test_a_step_records_the_checksum_of_its_start_where_a_replay_can_load_it(tmp_path):
    """The initial weights and every checkpointed step (save_freq 2) are hashed for the next
    step's record, each equal to its checkpoint's weights; the other steps hash nothing (a
    real model costs ~1 s per GB), unless a sync had hashed their start anyway."""
    from asyncrl.consumers.checkpoint import load_checkpoint
    from asyncrl.models.warm_start import load_policy
    from asyncrl.sync.checksum import weights_checksum

    cfg = _cfg(
        tmp_path,
        "trainer.total_training_steps=5",
        "trainer.save_freq=2",
        "trainer.keep_checkpoints=10",
        "actor_rollout_ref.rollout.num_workers=0",
        "async_training.trigger_parameter_sync_step=8",  # no sync within the run
    )
    broker = MemoryBroker()
    trainer = Trainer(cfg, io=trainer_io(cfg, broker, weights=None))
    initial = weights_checksum(trainer.model)
    for prompt in range(5 * cfg.required_samples // cfg.actor_rollout_ref.rollout.n):
        _publish_group(broker, cfg, prompt=prompt, version=0)
    trainer.run()
    trainer.close()

    steps = {
        s.step: s
        for s in (decode_step(r.value, r.headers) for r in broker.topics[cfg.topic("steps")])
    }
    assert [bool(steps[k].weights_checksum) for k in range(1, 6)] == [
        True,
        False,
        True,
        False,
        True,
    ]
    assert steps[1].weights_checksum == initial
    model, _ = load_policy(cfg)
    for k in (3, 5):  # started from the checkpoints of steps 2 and 4
        load_checkpoint(tmp_path / "mem" / "checkpoints" / f"step_{k - 1:06d}", model)
        assert steps[k].weights_checksum == weights_checksum(model)


def test_the_workers_engine_figures_are_averaged_and_unmeasured_ones_left_out(tmp_path):
    """rollouter/engine_occupancy and budget_unfilled_ratio: the mean over the workers of
    their last RolloutResumed; a worker's start-up window (-1, not measured) counts for
    nothing, so it cannot read as an empty engine."""
    from asyncrl.consumers.step_stats import StepStats

    cfg = _cfg(tmp_path, "actor_rollout_ref.rollout.num_workers=2")
    coordinator = _coordinator(cfg, MemoryBroker())
    resumed = [(0, 0.8, 0.1), (1, -1.0, -1.0)]  # worker 1 just started
    for worker, occupancy, unfilled in resumed:
        coordinator.on_event(
            ev.RolloutResumed(
                run_id=cfg.run_id,
                version=1,
                worker=worker,
                idle_ratio=0.2,
                engine_occupancy=occupancy,
                budget_unfilled_ratio=unfilled,
            )
        )
    stats = StepStats({}, n_devices=1)
    stats.close_sync_window(0.3, coordinator.rollouter)
    assert stats.history["rollouter/engine_occupancy"] == pytest.approx(0.8)
    assert stats.history["rollouter/budget_unfilled_ratio"] == pytest.approx(0.1)
    assert stats.history["rollouter/idle_ratio"] == pytest.approx(0.2)  # both workers
    coordinator.on_event(
        ev.RolloutResumed(
            run_id=cfg.run_id, version=2, worker=1, engine_occupancy=0.4, budget_unfilled_ratio=0.3
        )
    )
    stats.close_sync_window(0.3, coordinator.rollouter)
    assert stats.history["rollouter/engine_occupancy"] == pytest.approx(0.6)
    assert stats.history["rollouter/budget_unfilled_ratio"] == pytest.approx(0.2)


def _coordinator(cfg, broker: MemoryBroker, rows: list[dict] | None = None) -> SyncCoordinator:
    """A trainer's coordinator on ``broker`` over a stand-in model; its sync rows go to
    ``rows``."""
    return SyncCoordinator(
        cfg,
        broker.control(cfg),
        model=torch.nn.Linear(2, 2),
        checksum=lambda dtype=None: "c",
        position=lambda: (0, {}),
        write_row=(rows if rows is not None else []).append,
        wait_clock=WaitClock(),
    )


def test_the_summary_reads_the_last_syncs_resumes_and_says_none_when_it_saw_none(tmp_path):
    """The trainer trains on while the workers resume: the summary's sync_resumed_s_mean read
    0.000 for a run whose one sync's RolloutResumed it never read."""
    cfg = _cfg(tmp_path)
    broker = MemoryBroker()
    coordinator = _coordinator(cfg, broker)
    coordinator.control.start()
    assert coordinator.summary(wait_s=0.0)["sync_resumed_s_mean"] is None  # no syncs
    coordinator.requested_ts = {1: 100.0, 2: 200.0}
    coordinator.on_event(ev.RolloutResumed(run_id=cfg.run_id, version=1, worker=0, ts=100.02))
    worker_side = broker.control(cfg, worker=0, incarnation="w0")
    worker_side.publish(ev.RolloutResumed(run_id=cfg.run_id, version=2, worker=0, ts=200.04))
    summary = coordinator.summary(wait_s=5.0)
    assert summary["sync_resumed_s_mean"] == pytest.approx(0.03)
    assert summary["sync_resumed_s_max"] == pytest.approx(0.04)
    assert summary["sync_resumed_seen"] == "2 of 2"

    unseen = _coordinator(cfg, MemoryBroker())
    unseen.control.start()
    unseen.requested_ts = {1: 100.0}
    summary = unseen.summary(wait_s=0.1)  # a worker that died never resumes: bounded
    assert summary["sync_resumed_s_mean"] is None and summary["sync_resumed_seen"] == "0 of 1"


def test_the_coordinator_forgets_old_versions_and_its_summary_still_counts_them(tmp_path):
    """Per-version entries (request times, resumes, loads, the samples each worker delivered)
    were kept for the whole run: a long run's trainer grew with its syncs. It keeps the last
    VERSIONS_KEPT now; the summary counts every sync still."""
    from asyncrl.consumers.coordinator import VERSIONS_KEPT

    cfg = _cfg(tmp_path)
    broker = MemoryBroker()
    step = [0]
    coordinator = _coordinator(cfg, broker)
    coordinator.position = lambda: (step[0], {})
    coordinator.control.start()
    syncs = 5 * VERSIONS_KEPT
    for v in range(1, syncs + 1):
        step[0] += 1
        coordinator.received[(0, v - 1)] += 8
        coordinator.sync()
        took = 0.01 * v
        requested = coordinator.requested_ts[v]
        coordinator.on_event(
            ev.RolloutResumed(run_id=cfg.run_id, version=v, worker=0, ts=requested + took)
        )
    for per_version in ("requested_ts", "resumed_s", "trainer_side", "received"):
        assert len(getattr(coordinator, per_version)) <= VERSIONS_KEPT + 1, per_version
    summary = coordinator.summary(wait_s=0.0)
    assert summary["syncs"] == syncs and summary["sync_resumed_seen"] == f"{syncs} of {syncs}"
    mean = sum(0.01 * v for v in range(1, syncs + 1)) / syncs
    assert summary["sync_resumed_s_mean"] == pytest.approx(mean, abs=1e-3)
    assert summary["sync_resumed_s_max"] == pytest.approx(0.01 * syncs, abs=1e-3)


def test_each_step_trains_at_its_scheduled_learning_rate(tmp_path):
    """verl's warm-up (lr_warmup_steps=2) through the trainer: steps 1-3 at 0, lr/2, lr, each
    recorded as actor/lr in its step record."""
    cfg = _cfg(
        tmp_path,
        "trainer.total_training_steps=3",
        "actor_rollout_ref.rollout.num_workers=0",
        "actor_rollout_ref.actor.optim.lr=0.001",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=2",
    )
    broker = MemoryBroker()
    trainer = Trainer(cfg, io=trainer_io(cfg, broker, weights=None))
    for prompt in range(3):
        _publish_group(broker, cfg, prompt=prompt, version=0)
    trainer.run()
    trainer.close()
    steps = [decode_step(r.value, r.headers) for r in broker.topics[cfg.topic("steps")]]
    assert [s.metrics["actor/lr"] for s in steps] == pytest.approx([0.0, 0.0005, 0.001])


def test_a_step_whose_every_reward_failed_says_so(tmp_path, caplog):
    """A reward function failing at every call: each step learns nothing, and the trainer's
    log says so with the first failure (the progress bar's count alone did not say why)."""
    cfg = _cfg(
        tmp_path, "trainer.total_training_steps=1", "actor_rollout_ref.rollout.num_workers=0"
    )
    broker = MemoryBroker()
    trainer = Trainer(cfg, io=trainer_io(cfg, broker, weights=None))
    for i in range(cfg.actor_rollout_ref.rollout.n):
        failed = Trajectory(
            [5, 6, 2],
            [-0.5, -0.4, -0.3],
            0.0,
            reward_error="NameError: name 'sympy' is not defined",
        )
        sample = Sample(f"p0-{i}", "p0", 0, [1, 7, 8], "3", [failed])
        broker.publisher().publish(
            cfg.topic("samples"), sample.sample_id, encode_sample(sample),
            headers={SCHEMA_HEADER: SAMPLE_TAG},
        )  # fmt: skip
    with caplog.at_level("WARNING", logger="asyncrl.consumers.update"):
        trainer.run()
    trainer.close()
    assert "step 1: the reward failed for all 4 trajectories" in caplog.text
    assert "NameError: name 'sympy' is not defined" in caplog.text


def test_an_injected_backend_takes_the_step_the_trainers_own_weights_untouched(tmp_path):
    """The update backend is a seam: the benchmarks' SimulatedUpdate, passed in, takes the
    steps (no gradient: the weights stay), and the step's record carries its batch figures."""
    from asyncrl.bench.sim_update import SimulatedUpdate

    cfg = _cfg(
        tmp_path,
        "trainer.total_training_steps=1",
        "actor_rollout_ref.rollout.num_workers=0",
        "sim.train_s_per_sample=0",
    )
    broker = MemoryBroker()
    backend = SimulatedUpdate(cfg)
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    trainer = Trainer(cfg, io=trainer_io(cfg, broker, weights=None), backend=backend)
    _publish_group(broker, cfg, prompt=0, version=0)
    summary = trainer.run()
    trainer.close()
    assert summary["step"] == 1
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    (step,) = broker.read(cfg, "steps", decode_step)
    assert step.metrics["critic/score/mean"] == 0.5 and "actor/pg_loss" not in step.metrics
