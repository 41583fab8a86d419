"""The trainer's shared weight slots, mapped the way a worker on its host maps them."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from asyncrl.sync.shared_slots import SharedSlots, SlotsOffer, SlotsView, host_id


def test_a_worker_mapping_sees_what_the_trainer_writes_and_the_other_way():
    slots = SharedSlots(1000)
    try:
        offer = SlotsOffer.from_json(json.loads(json.dumps(slots.offer.as_json())))
        view = SlotsView(offer)
        slots.slot(0)[:3] = torch.tensor([1, 2, 3], dtype=torch.uint8)
        slots.slot(1)[-2:] = 7
        assert view.slot(0)[:3].tolist() == [1, 2, 3]
        assert view.slot(1)[-2:].tolist() == [7, 7]
        view.slot(0)[0] = 9  # one memory, not a copy
        assert int(slots.slot(0)[0]) == 9
    finally:
        slots.close()


def test_slots_are_aligned_for_any_dtype_and_sized_up():
    slots = SharedSlots(1001)
    try:
        assert slots.offer.slot_bytes % 64 == 0 and slots.fits(1001)
        assert not slots.fits(slots.offer.slot_bytes + 1)
        for i in (0, 1):
            assert slots.slot(i).data_ptr() % 64 == 0
            slots.slot(i)[:16].view(torch.float64)  # an unaligned view would raise
    finally:
        slots.close()


def test_a_mapping_of_something_else_is_refused():
    slots = SharedSlots(64)
    try:
        forged = dataclasses.replace(slots.offer, nonce="0" * 32)
        with pytest.raises(OSError, match="nonce mismatch"):
            SlotsView(forged)
    finally:
        slots.close()


def test_a_cuda_offer_travels_as_json_and_needs_a_gpu_to_open():
    ipc = (0, b"\x01\xff", 4224, 0, b"/torch_1_2", 5, b"\x00" * 4, True)
    offer = SlotsOffer("cuda", "ab" * 16, 2048, ipc=ipc, device_uuid="GPU-1")
    wire = json.dumps(offer.as_json())  # plain JSON: hex for the handles, no pickle
    back = SlotsOffer.from_json(json.loads(wire))
    assert back.kind == "cuda" and back.device_uuid == "GPU-1" and back.nbytes == 64 + 4096
    assert [bytes.fromhex(v) if isinstance(v, str) else v for v in back.ipc] == list(ipc)
    if not torch.cuda.is_available():
        with pytest.raises(OSError, match="no GPU"):
            SlotsView(back)
    with pytest.raises(ValueError, match="kind"):
        SlotsOffer.from_json({**offer.as_json(), "kind": "pickle"})


def test_host_id_names_this_machine():
    assert host_id() == host_id() and host_id().split("/")[0]
