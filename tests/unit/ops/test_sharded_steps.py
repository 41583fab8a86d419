"""A sharded trainer's checkpoints, read by the operator tools: two gloo ranks (real spawned
processes, FSDP2) train two steps on a Hugging Face policy and write sharded checkpoints;
``asyncrl export-model`` writes one Hugging Face checkpoint from the shards, and ``replay step``
re-runs a step on the two ranks that ran it bit for bit, and on one rank says it cannot and by
how much it differs. No broker: the step's record and samples are handed in, as in
test_replay_lr.py."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from rich.console import Console

from asyncrl.config import RunConfig, dump_config, load_config
from asyncrl.schemas.step import StepRecord, decode_step, encode_step
from tests.helpers import SMALL_MODEL
from tests.unit.consumers.test_fsdp_update import _samples


def _rank(rank: int, world: int, out: str, config: str) -> None:
    import torch.distributed as dist

    from asyncrl.consumers.checkpoint import TrainerState, write_checkpoint
    from asyncrl.consumers.fsdp_update import FsdpUpdate, broadcast_samples
    from asyncrl.models.warm_start import load_policy

    cfg = load_config(Path(config))
    torch.set_num_threads(cfg.trainer.torch_threads)
    dist.init_process_group("gloo", init_method=f"file://{out}/rdv", rank=rank, world_size=world)
    try:
        backend = FsdpUpdate(cfg, policy=load_policy(cfg))
        samples = broadcast_samples(_samples() if rank == 0 else None)
        for step in (1, 2):
            metrics = backend.step(samples, step, version=0)
            state = TrainerState(step=step, version=step, batcher={}, metrics={})
            write_checkpoint(cfg.run_dir, backend.snapshot(state), keep=5)
        weights = backend.full_state_dict()
        if rank == 0:
            torch.save(weights, f"{out}/weights.pt")
            Path(out, "metrics.json").write_text(json.dumps(metrics))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunConfig, Path]:
    """A run whose steps 1 and 2 two ranks trained and checkpointed; the run's config and the
    directory holding step 2's gathered weights and metrics."""
    from asyncrl.models.policy import TINY_CHAT_TEMPLATE
    from asyncrl.models.tiny import build_model, build_tokenizer

    tmp = tmp_path_factory.mktemp("sharded")
    tok = build_tokenizer()
    tok.chat_template = TINY_CHAT_TEMPLATE
    model = build_model(load_config(overrides=SMALL_MODEL).actor_rollout_ref.model, len(tok), 0)
    model.save_pretrained(tmp / "mine")
    tok.save_pretrained(tmp / "mine")
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tmp / 'mine'}",
            f"output_dir={tmp / 'runs'}",
            "run_id=r",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.actor.optim.lr=0.01",
            "async_training.require_batches=2",
            "data.max_prompt_length=5",
            "data.max_response_length=6",
        ]
    )
    dump_config(cfg, cfg.run_dir / "config.yaml")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = (2, str(tmp), str(cfg.run_dir / "config.yaml"))
    mp.start_processes(_rank, args=args, nprocs=2, start_method="spawn")
    return load_config(cfg.run_dir / "config.yaml"), tmp


def test_export_model_writes_one_hugging_face_checkpoint_from_the_shards(
    sharded_run: tuple[RunConfig, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM

    from asyncrl.cli import main

    cfg, tmp = sharded_run
    shards = cfg.run_dir / "checkpoints" / "step_000002" / "shards"
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    out = tmp / "exported"
    assert main(["export-model", str(cfg.run_dir), "--out", str(out)]) == 0
    assert "step_000002 of run r" in capsys.readouterr().out
    loaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    full = torch.load(tmp / "weights.pt", weights_only=True)
    assert set(loaded) == set(full)
    unequal = [k for k, v in full.items() if not torch.equal(loaded[k], v)]
    assert not unequal, unequal


def _replay(cfg: RunConfig, tmp: Path, monkeypatch: pytest.MonkeyPatch, ranks: int | None):
    from asyncrl.ops import replay

    samples = _samples()
    metrics = json.loads((tmp / "metrics.json").read_text())
    ids = [s.sample_id for s in samples]
    record = StepRecord("r", 2, 0, 0.0, ids, [0] * len(ids), list(range(len(ids))), metrics)
    record = decode_step(encode_step(record))  # the metrics as the log holds them
    monkeypatch.setattr(replay, "find_step", lambda *_: record)
    monkeypatch.setattr(replay, "fetch_samples", lambda *_: samples)
    text = io.StringIO()
    result = replay.replay_step(cfg, "127.0.0.1:1", 2, Console(file=text, width=200), ranks)
    return result, text.getvalue()


def test_replay_of_a_two_rank_step_on_two_ranks_is_bit_identical(
    sharded_run: tuple[RunConfig, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, tmp = sharded_run
    result, text = _replay(cfg, tmp, monkeypatch, None)  # as many ranks as ran it: 2
    assert (result["ranks"], result["ran_on"]) == (2, 2)
    assert result["weights_equal"], result["weights_max_abs_diff"]
    loss = result["metrics"]["actor/pg_loss"]
    assert loss["replayed"] == loss["recorded"]
    assert "bit-identical" in text and "cannot" not in text


def test_replay_of_a_two_rank_step_on_one_rank_shows_the_difference(
    sharded_run: tuple[RunConfig, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, tmp = sharded_run
    result, text = _replay(cfg, tmp, monkeypatch, 1)
    assert (result["ranks"], result["ran_on"]) == (1, 2)
    assert not result["weights_equal"]
    assert 0 < result["weights_max_abs_diff"] < 1e-5  # float32 rounding, not another step
    assert "cannot be bit-identical" in text and "--ranks 2" in text
