"""``asyncrl export-model RUN --out DIR``: a run's trained policy as a Hugging Face checkpoint.

The trainer's checkpoints (``checkpoints/step_N``) hold a torch state dict, its optimizer and
RNG: what a restart or ``asyncrl replay`` resumes from, but nothing transformers, vLLM or a
verl run (``actor_rollout_ref.model.path``) loads. This writes the weights of one such step
into the run's model (its ``actor_rollout_ref.model.path``, or the built-in tiny Qwen2) and
saves it with ``save_pretrained`` beside its tokenizer (chat template included), as verl's
model merger does for its FSDP checkpoints. A sharded trainer's checkpoint (``shards/``, one
file per rank: ``consumers/fsdp_checkpoint.py``) is read whole into that one model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.config import RunConfig


class ExportError(RuntimeError):
    pass


def checkpoint_of(cfg: RunConfig, step: int | None) -> Path:
    """The checkpoint directory of ``step``, or the run's latest; ExportError names what is
    there instead."""
    from asyncrl.consumers.checkpoint import checkpoint_dir, latest_checkpoint

    root = cfg.run_dir / "checkpoints"
    path = latest_checkpoint(cfg.run_dir) if step is None else checkpoint_dir(cfg.run_dir, step)
    if path is None or not _has_weights(path):
        kept = sorted(p.name for p in root.glob("step_*") if _has_weights(p))
        what = "no checkpoint" if step is None else f"no checkpoint of step {step}"
        raise ExportError(
            f"{what} in {root} (kept: {', '.join(kept) or 'none'}; trainer.save_freq, "
            "trainer.keep_checkpoints)"
        )
    return path


def _has_weights(path: Path) -> bool:
    """``path`` holds a checkpoint's weights: one process's model.pt or N ranks' shards."""
    return (path / "model.pt").is_file() or (path / "shards" / ".metadata").is_file()


def export_model(cfg: RunConfig, out: Path, step: int | None = None) -> Path:
    """Write the checkpoint of ``step`` (the latest: None) as a Hugging Face checkpoint
    directory ``out``; returns the checkpoint it read."""
    import torch

    from asyncrl.consumers.checkpoint import is_sharded
    from asyncrl.models.warm_start import load_policy

    path = checkpoint_of(cfg, step)
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} is not empty: name a new directory with --out")
    model: Any
    model, tokenizer = load_policy(cfg)  # a transformers model: config, save_pretrained
    if is_sharded(path):  # N ranks' shards, read whole (DCP puts each piece in its place)
        from asyncrl.consumers.dcp_read import read_weights

        read_weights(path, model)
    else:
        model.load_state_dict(torch.load(path / "model.pt", weights_only=True))
    model.config.use_cache = True  # a generation-ready checkpoint (training ran without one)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return path
