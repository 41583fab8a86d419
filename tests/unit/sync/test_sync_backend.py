"""``sync.backend=auto`` names the same backend at both ends of a pair, whatever their devices."""

import pytest
import torch

from asyncrl.config import SyncConfig
from asyncrl.sync.rendezvous import resolve_backend as _resolve_backend


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_auto_resolves_as_the_config_reads_it_on_every_device(device):
    # The trainer's end passes SyncConfig.transport_backend; a worker's end, or a benchmark's,
    # may pass "auto" with its own device (a GPU worker): both must get the same backend.
    assert _resolve_backend("auto", torch.device(device)) == SyncConfig().transport_backend


def test_nccl_needs_a_cuda_device():
    with pytest.raises(ValueError, match="nccl needs a CUDA device"):
        _resolve_backend("nccl", torch.device("cpu"))
    assert _resolve_backend("nccl", torch.device("cuda")) == "nccl"
