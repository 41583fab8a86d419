"""The trainer's weights moved into shared memory and read in place, in one process (the
mapping a worker on the trainer's host makes; tests/integration/test_weight_collective.py runs
it between processes)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from asyncrl.bench.snapshot import load_snapshot, save_snapshot
from asyncrl.sync.buckets import named_tensors, weight_manifest
from asyncrl.sync.direct import DirectOffer, DirectView, ExposedWeights


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
        self.register_buffer("empty", torch.zeros(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mid(self.embed(x)))


def _expose(model: nn.Module, dtype: torch.dtype | None = None) -> ExposedWeights:
    tensors = named_tensors(model)
    return ExposedWeights(weight_manifest(tensors, dtype), tensors, epoch=1)


def _view(exposed: ExposedWeights) -> DirectView:
    return DirectView(DirectOffer.from_json(json.loads(json.dumps(exposed.offer.as_json()))))


def test_the_trainer_keeps_training_in_shared_memory_and_a_reader_sees_each_step():
    torch.manual_seed(0)
    model = Tied()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    exposed = _expose(model)
    try:
        assert model.head.weight is model.embed.weight  # still tied: one object moved
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k]), k  # moved, not changed
        view = _view(exposed)
        worker = Tied()
        worker_tensors = named_tensors(worker)
        targets = [[worker_tensors[s.name]] for s in weight_manifest(worker_tensors)]
        x = torch.randint(0, 16, (4, 5))
        for _ in range(2):  # the optimizer writes the memory the worker reads
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            view.copy_into(targets)
            for k, v in model.state_dict().items():
                assert torch.equal(worker.state_dict()[k], v), k
        assert not torch.equal(model.mid.weight, before["mid.weight"])
    finally:
        exposed.close()


def test_moved_weights_still_save_and_load_as_before(tmp_path):
    """Each tensor keeps a storage of its own: torch.save refuses tensors of several dtypes
    in one storage, safetensors tensors sharing one (checkpoints, the snapshot path)."""
    model = Tied()
    exposed = _expose(model)
    try:
        torch.save(model.state_dict(), tmp_path / "model.pt")
        loaded = torch.load(tmp_path / "model.pt")
        path = save_snapshot(model, tmp_path, 3)
        other = Tied()
        assert load_snapshot(other, path) == 3
        for k, v in model.state_dict().items():
            assert torch.equal(loaded[k], v) and torch.equal(other.state_dict()[k], v), k
    finally:
        exposed.close()


def test_a_bf16_reader_gets_the_float32_weights_cast():
    model = Tied()
    exposed = _expose(model, torch.bfloat16)
    try:
        worker = Tied().to(torch.bfloat16)
        tensors = named_tensors(worker)
        manifest = weight_manifest(tensors)
        _view(exposed).copy_into([[tensors[s.name]] for s in manifest])
        for k, v in model.state_dict().items():
            assert torch.equal(worker.state_dict()[k], v.to(worker.state_dict()[k].dtype)), k
    finally:
        exposed.close()


def test_a_tensor_viewing_a_larger_storage_is_not_moved():
    """Moving a view would split it from the rest of its storage (a fused weight): refused,
    and the caller keeps the slots."""
    fused = torch.zeros(6, 4)
    state = {"q": fused[:2], "kv": fused[2:]}
    with pytest.raises(ValueError, match="view into a larger storage"):
        ExposedWeights(weight_manifest(state), state, epoch=1)
    assert state["q"].untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()


def test_a_wrong_memory_is_refused():
    model = Tied()
    exposed = _expose(model)
    try:
        raw = exposed.offer.as_json()
        raw["nonce"] = "0" * 32
        with pytest.raises(OSError, match="nonce mismatch"):
            DirectView(DirectOffer.from_json(raw))
    finally:
        exposed.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the path of a process without a GPU")
def test_gpu_weights_offered_to_a_process_without_a_gpu_are_refused_clearly():
    """The worker then says it maps something else (the slots, or the collective)."""
    offer = DirectOffer("direct_cuda", 1, "0" * 32, ((0, "00", 64, 0),), (), "GPU-x")
    with pytest.raises(OSError, match="no GPU"):
        DirectView(offer)
