"""``bench sync`` at smoke size: two real processes, every way of moving the weights."""

import io
import json

import pytest
import torch
from rich.console import Console

from asyncrl.bench.sync import (
    CHECKSUMS,
    METHODS,
    methods_for,
    on_device,
    qwen2_like_state,
    sync,
)
from asyncrl.sync.copy_plan import WAYS

pytestmark = pytest.mark.slow


def test_qwen2_like_state_has_the_named_size():
    state = qwen2_like_state("50M", fill=False)
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]  # tied: sent once
    params = sum(t.numel() for n, t in state.items() if n != "lm_head.weight")
    assert 45e6 < params < 60e6


def test_on_device_keeps_tied_weights_tied_and_a_gpu_measures_what_a_run_uses():
    state = on_device(qwen2_like_state("5M", fill=False), "cpu")
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]
    assert len({t.untyped_storage().data_ptr() for t in state.values()}) == len(state) - 1
    flat = on_device(state, "cpu", flat=True)  # as the roles keep their weights on a GPU
    assert flat["lm_head.weight"] is flat["model.embed_tokens.weight"]
    assert len({t.untyped_storage().data_ptr() for t in flat.values()}) == 1
    assert methods_for("cpu") == METHODS
    assert methods_for("cuda:0") == ("shared memory", "in place", "in place, apart", "bucketed")


def test_sync_smoke(tmp_path):
    out = io.StringIO()
    figures = sync(
        None,
        [f"output_dir='{tmp_path}'"],
        Console(file=out, width=200),
        shapes=("5M",),
        rounds=1,
        pause_resume=False,
    )
    row = figures["transfer"]["5M"]
    assert row["bytes"] == 2 * row["params"] and row["params"] > 4e6
    for way in (*METHODS, "memcpy", *CHECKSUMS):
        assert row[way]["s"] > 0 and row[way]["gbps"] > 0
    for way in METHODS:  # one timed round after the warm-up, checksum checked by sync()
        assert len(row[way]["rounds_s"]) == 1
    # the receiver is on this host: it read the trainer's memory in those rows only
    assert row["shared memory"]["shared_workers"] == row["in place"]["shared_workers"] == 1
    assert row["bucketed"]["shared_workers"] == row["per-tensor"]["shared_workers"] == 0
    assert row["shared memory"]["medium"] == "memfd" and row["bucketed"]["medium"] == "collective"
    assert row["in place"]["medium"] == "direct_memfd"
    assert "per-tensor / bucketed time" in out.getvalue()
    assert "shared memory (memfd) / in place (direct_memfd) time" in out.getvalue()
    assert "checksum sha256 / on-device" in out.getvalue()
    saved = json.loads(next(tmp_path.glob("bench-sync-*.json")).read_text())
    assert saved["transfer"]["5M"]["bytes"] == row["bytes"]
    assert not list(tmp_path.glob("bench-sync-*/*"))  # snapshots cleaned up


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_sync_on_a_gpu_hands_over_by_cuda_ipc(tmp_path):
    figures = sync(
        None,
        [f"output_dir='{tmp_path}'"],
        Console(file=io.StringIO(), width=200),
        shapes=("5M",),
        rounds=1,
        pause_resume=False,
        device="cuda",
    )
    row = figures["transfer"]["5M"]
    assert row["shared memory"]["medium"] == "cuda"  # from the warm-up round on
    assert row["in place"]["medium"] == "direct_cuda"
    assert row["in place, apart"]["medium"] == "direct_cuda"  # both layouts delivered every bit
    assert {row[w]["copy_way"] for w in ("in place", "in place, apart")} <= set(WAYS)
