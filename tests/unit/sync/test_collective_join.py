"""A rollout worker waiting for a trainer whose store is not up yet (role by role: the worker
started first, or waiting for a trainer started again by hand) announces itself every couple
of seconds, as its docstring says, not at each half-second check: a minute's wait put 110
WorkerStarted events on ``control``, which every process reads from its start."""

from __future__ import annotations

import pytest
import torch

from asyncrl.launch.broker import free_port
from asyncrl.sync.receiver import WeightReceiver
from asyncrl.sync.rendezvous import ANNOUNCE_EVERY_S as _ANNOUNCE_EVERY_S


def test_a_worker_waiting_for_the_store_announces_every_couple_of_seconds() -> None:
    announced: list[int] = []
    waited: list[int] = []
    timeout_s = 2.0  # announced at 0 s and at most once more (2 s), checked between
    rx = WeightReceiver("127.0.0.1", free_port(), "gloo", torch.device("cpu"), timeout_s)
    with pytest.raises(RuntimeError, match="connecting to the trainer's store"):
        rx.join(0, "x", announce=lambda: announced.append(1), waiting=lambda: waited.append(1))
    assert 1 <= len(announced) <= timeout_s / _ANNOUNCE_EVERY_S + 1  # was one per 0.5 s: 4
    assert len(waited) >= 2  # a stop is still heard between two announcements
