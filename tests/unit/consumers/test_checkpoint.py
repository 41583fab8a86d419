"""Checkpoints written on a thread while training goes on: what is written is the state at the
snapshot, not what the trainer changed since; one write at a time; a failed write is raised."""

import json
import threading

import pytest
import torch

from asyncrl.config import ModelConfig
from asyncrl.consumers.checkpoint import (
    CheckpointWriter,
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    snapshot,
)
from asyncrl.models.tiny import build_model


def _trained(seed: int = 0):
    model = build_model(ModelConfig(hidden_size=32, intermediate_size=64), 30, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(input_ids=torch.tensor([[1, 5, 6, 7]])).logits.sum().backward()
    optimizer.step()  # the optimizer has state to save
    return model, optimizer


def test_the_written_checkpoint_is_the_state_at_the_snapshot(tmp_path):
    model, optimizer = _trained()
    history = {"val/accuracy": 0.5}
    state = TrainerState(step=4, version=1, batcher={"offsets": {"0": 12}}, metrics=history)
    snap = snapshot(model, optimizer, state)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    want_optim = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    # The trainer goes on: weights, optimizer state and history change before the write.
    model(input_ids=torch.tensor([[1, 8, 9]])).logits.sum().backward()
    optimizer.step()
    history["val/accuracy"] = 0.9
    writer = CheckpointWriter(tmp_path, keep=3)
    writer.submit(snap)
    writer.wait()

    path = latest_checkpoint(tmp_path)
    assert path is not None and path.name == "step_000004" and writer.written == path
    fresh, fresh_optim = _trained(seed=1)
    loaded = load_checkpoint(path, fresh, fresh_optim)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, want[k]), k
    assert torch.equal(fresh_optim.state_dict()["state"][0]["exp_avg"], want_optim)
    assert loaded.metrics == {"val/accuracy": 0.5} and loaded.batcher == {"offsets": {"0": 12}}
    assert json.loads((path / "state.json").read_text())["step"] == 4


def test_tied_weights_are_copied_and_stored_once(tmp_path):
    model, optimizer = _trained()
    tied = model.get_output_embeddings().weight
    assert tied is model.get_input_embeddings().weight
    snap = snapshot(model, optimizer, TrainerState(1, 0, {}, {}))
    names = [k for k, v in model.state_dict().items() if v.data_ptr() == tied.data_ptr()]
    assert len(names) == 2
    assert snap.model[names[0]] is snap.model[names[1]]
    assert snap.model[names[0]].data_ptr() != tied.data_ptr()  # a copy, not the live weights


def test_one_write_at_a_time_and_a_failed_write_is_raised(tmp_path, monkeypatch):
    from asyncrl.consumers import checkpoint

    model, optimizer = _trained()
    release = threading.Event()
    started: list[int] = []
    write = checkpoint.write_checkpoint

    def slow_write(run_dir, snap, keep=3):
        started.append(snap.step)
        assert release.wait(10)
        return write(run_dir, snap, keep)

    monkeypatch.setattr(checkpoint, "write_checkpoint", slow_write)
    writer = CheckpointWriter(tmp_path, keep=3)
    writer.submit(snapshot(model, optimizer, TrainerState(1, 0, {}, {})))
    assert not writer.idle()
    second = threading.Thread(
        target=writer.submit, args=(snapshot(model, optimizer, TrainerState(2, 0, {}, {})),)
    )
    second.start()
    second.join(0.3)
    assert second.is_alive() and started == [1]  # the second waits for the first
    release.set()
    second.join(10)
    writer.wait()
    assert started == [1, 2] and writer.idle()
    assert latest_checkpoint(tmp_path).name == "step_000002"

    def failing_write(run_dir, snap, keep=3):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "write_checkpoint", failing_write)
    writer.submit(snapshot(model, optimizer, TrainerState(3, 0, {}, {})))
    with pytest.raises(RuntimeError, match="writing a checkpoint failed: disk full"):
        writer.wait()
    assert latest_checkpoint(tmp_path).name == "step_000002"  # the last good one stays


def _write(tmp_path, model, optimizer, step):
    from asyncrl.consumers.checkpoint import write_checkpoint

    state = TrainerState(step=step, version=1, batcher={}, metrics={})
    return write_checkpoint(tmp_path, snapshot(model, optimizer, state), keep=3)


def test_a_kill_while_the_last_step_is_written_again_resumes_from_a_complete_one(
    tmp_path, monkeypatch
):
    """The run's last step is written twice (in the loop, then at the end). The second write
    deleted the first before moving its own into place, with ``latest`` naming it: a kill in
    between (a helper's watcher hit it at once) left ``latest`` on a half-deleted directory,
    and the restart trained every step again from the first policy."""
    from asyncrl.consumers import checkpoint

    model, optimizer = _trained()
    _write(tmp_path, model, optimizer, 15)
    first = _write(tmp_path, model, optimizer, 20)
    real_rename = checkpoint.Path.rename

    def killed_at_the_swap(self, target):  # the moment the old step_20 has left its place
        if self.name.startswith(".tmp_step_"):
            raise KeyboardInterrupt("SIGKILL")
        return real_rename(self, target)

    monkeypatch.setattr(checkpoint.Path, "rename", killed_at_the_swap)
    with pytest.raises(KeyboardInterrupt):
        _write(tmp_path, model, optimizer, 20)
    monkeypatch.undo()
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.name == "step_000015"  # complete; step_20 moved aside
    assert load_checkpoint(found, *_trained(1)).step == 15
    # A half-deleted directory named by latest is passed over the same way.
    assert first.name == "step_000020" and not first.exists()
    from asyncrl.consumers.checkpoint import remove_leftovers

    left = remove_leftovers(tmp_path)  # the killed writer's two directories
    assert sorted(p.name.split("_")[0] for p in left) == [".old", ".tmp"]
    assert not list((tmp_path / "checkpoints").glob(".*_step_*"))


def test_a_run_has_one_trainer_and_its_lock_goes_with_it(tmp_path):
    """Two ``asyncrl train`` of one run (role by role) both trained: the audit failed with 14
    reused versions and 24 regressions. The second now stops at once, naming the first."""
    import os
    import subprocess
    import sys

    from asyncrl.consumers.checkpoint import TrainerAlreadyRunning, trainer_lock

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from asyncrl.consumers.checkpoint import trainer_lock\n"
            f"lock = trainer_lock(Path({str(tmp_path)!r}))\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(TrainerAlreadyRunning, match=f"pid {holder.pid} on"):
            trainer_lock(tmp_path)
    finally:
        holder.kill()  # a SIGKILLed trainer: the system lets go of its lock
        holder.wait()
    lock = trainer_lock(tmp_path)
    assert f"pid {os.getpid()}" in (tmp_path / "checkpoints" / ".trainer.lock").read_text()
    lock.close()


def test_the_state_is_encoded_on_the_writer_thread(tmp_path, monkeypatch):
    """The batcher's settled ids grow with the run; encoding them in ``snapshot`` stalled the
    trainer for seconds per save in a long run, so the writer's thread does it."""
    model, optimizer = _trained()
    settled = {f"s{i}": (0, i) for i in range(1000)}
    state = TrainerState(7, 2, {"offsets": {"0": 1000}, "settled": settled}, {"val/accuracy": 0.5})
    encoded_on: list[str] = []
    dumps = json.dumps

    def spy(obj, **kw):
        encoded_on.append(threading.current_thread().name)
        return dumps(obj, **kw)

    monkeypatch.setattr(json, "dumps", spy)
    snap = snapshot(model, optimizer, state)
    assert encoded_on == []
    state.metrics["val/accuracy"] = 0.9  # the trainer goes on
    writer = CheckpointWriter(tmp_path, keep=3)
    writer.submit(snap)
    writer.wait()
    assert encoded_on == ["checkpoint-7"]
    loaded = load_checkpoint(writer.written, *_trained(seed=1))
    assert loaded.metrics == {"val/accuracy": 0.5}
    assert loaded.batcher["settled"]["s999"] == [0, 999]
