"""Launcher decisions that need no broker."""

import io

import torch
from rich.console import Console

from asyncrl.consumers.checkpoint import TrainerState, latest_checkpoint, save_checkpoint
from asyncrl.ops.config import load_config
from asyncrl.ops.launcher import archive_orphaned_run


def _cfg(tmp_path):
    return load_config(overrides=["run_id=demo", f"output_dir='{tmp_path}'"])


def test_checkpoint_without_its_log_is_moved_aside(tmp_path):
    cfg = _cfg(tmp_path)
    model = torch.nn.Linear(2, 2)
    state = TrainerState(step=3, version=3, batcher={}, metrics={})
    save_checkpoint(cfg.run_dir, model, torch.optim.SGD(model.parameters(), lr=0.1), state)
    out = io.StringIO()

    archived = archive_orphaned_run(cfg, Console(file=out, width=200))

    assert archived is not None and archived.parent == cfg.run_dir.parent
    assert latest_checkpoint(archived) is not None, "the old run is kept, not deleted"
    assert not cfg.run_dir.exists()
    assert "starting afresh" in out.getvalue()


def test_run_dir_without_checkpoint_is_left_alone(tmp_path):
    cfg = _cfg(tmp_path)
    (cfg.run_dir / "logs").mkdir(parents=True)
    assert archive_orphaned_run(cfg, Console(file=io.StringIO())) is None
    assert (cfg.run_dir / "logs").exists()
