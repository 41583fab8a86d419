"""The per-hop table of a sync, from control events with known timestamps."""

import pytest

from asyncrl.ops.sync_hops import hop_medians, sync_hops
from asyncrl.schemas import control as ev

RUN = "hops"


def _paused_sync(v: int, t0: float, workers: dict[int, float]) -> list[ev.ControlEvent]:
    """A paused sync at ``t0``: worker w reads the request ``workers[w]`` s later, pauses
    for 2 ms; the trainer reads the last pause 3 ms later and sends for 4 ms; each worker
    reads WeightsPublished 5 ms after it, and resumes 1 ms after loading."""
    events: list[ev.ControlEvent] = [ev.SyncRequested(run_id=RUN, version=v, ts=t0)]
    for w, seen in workers.items():
        events.append(
            ev.RolloutPaused(run_id=RUN, version=v, worker=w, ts=t0 + seen + 0.002, pause_s=0.002)
        )
    last = max(e.ts for e in events)
    pub = last + 0.003 + 0.004
    events.append(ev.WeightsPublished(run_id=RUN, version=v, ts=pub, transfer_s=0.004))
    for w in workers:
        events.append(ev.WeightsLoaded(run_id=RUN, version=v, worker=w, ts=pub + 0.005))
        events.append(ev.RolloutResumed(run_id=RUN, version=v, worker=w, ts=pub + 0.006))
    return events


def test_a_paused_sync_splits_into_its_hops():
    events = _paused_sync(1, 100.0, {0: 0.010, 1: 0.020}) + _paused_sync(2, 200.0, {0: 0.010})
    rows = sync_hops(events)
    assert [(r["version"], r["worker"]) for r in rows] == [(1, 0), (1, 1), (2, 0)]
    first, slow, _ = rows
    assert first["request_to_paused"] == pytest.approx(0.012)
    assert slow["request_to_paused"] == pytest.approx(0.022)
    # The trainer sends once the last worker has paused: 3 ms after worker 1's pause.
    assert first["paused_to_send"] == slow["paused_to_send"] == pytest.approx(0.003)
    assert first["transfer"] == 0.004
    assert first["published_to_loaded"] == pytest.approx(0.005)
    assert first["loaded_to_resumed"] == pytest.approx(0.001)
    assert slow["total"] == pytest.approx(0.022 + 0.003 + 0.004 + 0.006)
    medians = hop_medians(rows)
    assert medians["request_to_paused"] == pytest.approx(0.012)
    assert not first["in_flight"]


def test_an_in_flight_update_has_no_pause_hop_and_a_cut_short_sync_is_left_out():
    req = ev.SyncRequested(run_id=RUN, version=1, ts=10.0)
    pub = ev.WeightsPublished(run_id=RUN, version=1, ts=10.004, transfer_s=0.003)
    swapped = [
        ev.RolloutPaused(run_id=RUN, version=1, worker=0, ts=10.009, pause_s=0.001),
        ev.WeightsLoaded(run_id=RUN, version=1, worker=0, ts=10.009),
        ev.RolloutResumed(run_id=RUN, version=1, worker=0, ts=10.010),
    ]
    # Version 2: the worker paused, then the trainer died (no WeightsPublished).
    cut = [
        ev.SyncRequested(run_id=RUN, version=2, ts=20.0),
        ev.RolloutPaused(run_id=RUN, version=2, worker=0, ts=20.01),
    ]
    [row] = sync_hops([req, pub, *swapped, *cut])
    assert row["in_flight"] and "request_to_paused" not in row
    assert row["request_to_published"] == pytest.approx(0.004)
    assert row["published_to_resumed"] == pytest.approx(0.006)
    assert row["total"] == pytest.approx(0.010)
