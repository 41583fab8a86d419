"""Sharded checkpoints (consumers/fsdp_checkpoint.py): two gloo ranks on the CPU, real processes
(spawned as in test_fsdp_update.py), each writing its own shards with torch.distributed.checkpoint.

A resume on the same two ranks continues bit for bit; a checkpoint of two ranks loads into one
process and one process's into two ranks (DCP reshards), their next steps agreeing within the
float32 rounding of a 2-rank step. A checkpoint rank 0 cannot start stops every rank."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.multiprocessing as mp

from asyncrl.config import RunConfig
from asyncrl.consumers.checkpoint import TrainerState, latest_checkpoint
from tests.unit.consumers.test_fsdp_update import _cfg, _policy, _samples

BATCHER = {"settled": {"0": 17}, "consumed": {"w0": 9}, "settled_ids": ["s1", "s2"]}


def _run_cfg(out: str) -> RunConfig:
    return _cfg().at_dir(Path(out) / "run")


def _state(step: int) -> TrainerState:
    return TrainerState(step=step, version=step, batcher=BATCHER, metrics={"m": 1.0})


def _spawn(fn: object, out: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(fn, args=(2, str(out)), nprocs=2, start_method="spawn")  # type: ignore[arg-type]


def _resume_rank(rank: int, world: int, out: str) -> None:
    """Train 2 steps, checkpoint, train 2 more (the write in flight meanwhile: the snapshot is
    a copy); then a new backend restores the checkpoint and trains the same 2 steps."""
    import torch.distributed as dist

    from asyncrl.consumers.checkpoint import write_checkpoint
    from asyncrl.consumers.fsdp_update import FsdpUpdate, broadcast_samples

    dist.init_process_group("gloo", init_method=f"file://{out}/rdv", rank=rank, world_size=world)
    try:
        cfg = _run_cfg(out)
        first = FsdpUpdate(cfg, policy=_policy(cfg))
        samples = broadcast_samples(_samples() if rank == 0 else None)
        for step in (1, 2):
            first.step(samples, step, version=0)
        snap = first.snapshot(_state(2))
        for step in (3, 4):
            first.step(samples, step, version=0)
        write_checkpoint(cfg.run_dir, snap, keep=2)  # rank 0 publishes; the others wait
        trained = first.full_state_dict()
        dist.barrier()
        second = FsdpUpdate(cfg, policy=_policy(cfg))
        state = second.load(latest_checkpoint(cfg.run_dir))  # type: ignore[arg-type]
        for step in (3, 4):
            second.step(samples, step, version=0)
        resumed = second.full_state_dict()
        if rank == 0:
            torch.save({"trained": trained, "resumed": resumed}, f"{out}/weights.pt")
            Path(out, "state.json").write_text(json.dumps(state.__dict__))
    finally:
        dist.destroy_process_group()


def test_a_resume_on_the_same_ranks_continues_bit_for_bit(tmp_path: Path) -> None:
    _spawn(_resume_rank, tmp_path)
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    files = sorted(p.name for p in ckpt.iterdir())
    assert files == ["rng_0.pt", "rng_1.pt", "shards", "state.json"]
    shards = sorted(p.name for p in (ckpt / "shards").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # each rank its own
    sizes = [(ckpt / "shards" / f"__{r}_0.distcp").stat().st_size for r in (0, 1)]
    assert max(sizes) < 0.6 * sum(sizes), sizes  # each about half: its shards, not the whole
    assert json.loads((ckpt / "state.json").read_text())["world_size"] == 2
    assert not list(ckpt.parent.glob(".tmp_*"))
    state = json.loads((tmp_path / "state.json").read_text())
    assert state == {"step": 2, "version": 2, "batcher": BATCHER, "metrics": {"m": 1.0}}
    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    trained, resumed = weights["trained"], weights["resumed"]
    start = _policy(_cfg())[0].state_dict()
    assert max(float((trained[k] - start[k]).abs().max()) for k in start) > 1e-4
    assert set(trained) == set(resumed) == set(start)
    unequal = [k for k in trained if not torch.equal(trained[k], resumed[k])]
    assert not unequal, unequal


def _reshard_rank(rank: int, world: int, out: str) -> None:
    """Load the one-process checkpoint the test wrote into two ranks, train a step, write a
    sharded checkpoint of it."""
    import torch.distributed as dist

    from asyncrl.consumers.checkpoint import CheckpointWriteError, checkpoint_dir, write_checkpoint
    from asyncrl.consumers.fsdp_checkpoint import ShardedCheckpointer
    from asyncrl.consumers.fsdp_update import FsdpUpdate, broadcast_samples

    dist.init_process_group("gloo", init_method=f"file://{out}/rdv", rank=rank, world_size=world)
    try:
        cfg = _run_cfg(out)
        backend = FsdpUpdate(cfg, policy=_policy(cfg))
        backend.load(checkpoint_dir(cfg.run_dir, 1))
        loaded = backend.full_state_dict()
        samples = broadcast_samples(_samples() if rank == 0 else None)
        backend.step(samples, 2, version=0)
        write_checkpoint(cfg.run_dir, backend.snapshot(_state(2)), keep=3)
        after = backend.full_state_dict()
        if rank == 0:
            torch.save({"loaded": loaded, "after": after}, f"{out}/weights.pt")
        # rank 0 cannot make the checkpoint's directory: every rank stops, none waits
        blocked = ShardedCheckpointer(backend.model, backend.optimizer, None, Path(out, "blocked"))
        try:
            blocked.snapshot(_state(3))
        except CheckpointWriteError as err:
            Path(out, f"refused_{rank}").write_text(str(err))
    finally:
        dist.destroy_process_group()


def test_checkpoints_reshard_between_one_process_and_two_ranks(tmp_path: Path) -> None:
    from asyncrl.consumers.checkpoint import checkpoint_dir, save_checkpoint
    from asyncrl.consumers.local_update import LocalUpdate

    cfg = _run_cfg(str(tmp_path))
    one = LocalUpdate(cfg, policy=_policy(cfg))
    one.step(_samples(), 1, version=0)
    save_checkpoint(cfg.run_dir, one.model, one.optimizer, _state(1))
    (tmp_path / "blocked").mkdir()
    (tmp_path / "blocked" / "checkpoints").write_text("a file where a directory goes")
    _spawn(_reshard_rank, tmp_path)  # one process's step 1 -> two ranks -> step 2, sharded
    for rank in (0, 1):
        assert "cannot write the checkpoint of step 3" in (tmp_path / f"refused_{rank}").read_text()
    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    ref = one.model.state_dict()
    assert all(torch.equal(weights["loaded"][k], ref[k]) for k in ref)  # 1 -> 2: the same

    one.step(_samples(), 2, version=0)  # the optimizer's state came along: step 2 agrees
    diff = max(
        float((weights["after"][k] - v).abs().max()) for k, v in one.model.state_dict().items()
    )
    assert diff < 1e-5, diff

    back = LocalUpdate(cfg, policy=_policy(cfg))  # 2 -> 1: a sharded checkpoint, whole
    state = back.load(checkpoint_dir(cfg.run_dir, 2))
    assert state.step == 2 and state.batcher == BATCHER
    got = back.model.state_dict()
    assert all(torch.equal(got[k], weights["after"][k]) for k in got)
    ref_exp_avg = [s["exp_avg"] for s in one.optimizer.state_dict()["state"].values()]
    got_exp_avg = [s["exp_avg"] for s in back.optimizer.state_dict()["state"].values()]
    pairs = zip(ref_exp_avg, got_exp_avg, strict=True)
    assert max(float((a - b).abs().max()) for a, b in pairs) < 1e-5
    assert latest_checkpoint(cfg.run_dir) == checkpoint_dir(cfg.run_dir, 2)


def test_a_sharded_checkpoint_without_its_index_or_state_is_not_resumed_from(
    tmp_path: Path,
) -> None:
    """Rank 0 writes ``shards/.metadata`` once every rank's shards are written, and
    ``state.json`` after it: a directory lacking either is a write cut short."""
    from asyncrl.consumers.checkpoint import checkpoint_dir

    for step, files in (
        (1, ("shards/.metadata", "shards/__0_0.distcp", "state.json")),
        (2, ("shards/__0_0.distcp", "shards/__1_0.distcp", "state.json")),  # no index
        (3, ("shards/.metadata", "shards/__0_0.distcp")),  # no state
    ):
        for name in files:
            (checkpoint_dir(tmp_path, step) / name).parent.mkdir(parents=True, exist_ok=True)
            (checkpoint_dir(tmp_path, step) / name).write_text("{}")
    (tmp_path / "checkpoints" / "latest").write_text("step_000003")
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 1)
