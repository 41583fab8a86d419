"""``asyncrl inspect control``: each row details what its event is about. A Validated row
showed its step but not its accuracy, a SamplesDropped its count but not which samples (nor,
from the trainer, whose budget it refunded), a TrainerResumed not its checkpoint's version."""

from __future__ import annotations

from asyncrl.kafka.record import Record
from asyncrl.ops.inspect_log import _control_row
from asyncrl.schemas import control as ev


def _details(event: ev.ControlEvent) -> str:
    rec = Record("r.control", 0, 7, "r", 1_700_000_000_000, {}, ev.encode_event(event))
    return _control_row(rec, None, None)["details"]


def test_a_control_row_details_what_its_event_is_about() -> None:
    assert _details(ev.Validated("r", 3, worker=0, step=12, accuracy=0.905)) == (
        "step=12, accuracy=0.905"
    )
    dropped = ev.SamplesDropped(
        "r", 4, count=2, reason="stale", sample_ids=["a@0", "b@0"], target_worker=1
    )
    assert _details(dropped) == "count=2, reason=stale, target_worker=1, sample_ids=a@0 b@0"
    own = ev.SamplesDropped("r", 4, worker=1, count=1, reason="run finished", target_worker=1)
    assert _details(own) == "count=1, reason=run finished"  # its own budget; no ids: none shown
    resumed = ev.TrainerResumed("r", 9, step=6, checkpoint_version=1)
    assert _details(resumed) == "step=6, checkpoint_version=1"
    loaded = ev.WeightsLoaded("r", 2, worker=0, load_s=0.0123, checksum_ok=True)
    assert _details(loaded) == "load_s=0.012, checksum_ok=True"  # as before


def test_a_pause_row_says_how_many_samples_it_left_being_scored() -> None:
    """The samples a pause left only being scored (published after the transfer) were on the
    event as ``in_flight_finished`` but never set nor shown."""
    paused = ev.RolloutPaused("r", 2, worker=0, pause_s=0.004, n_partial=1, in_flight_finished=3)
    assert _details(paused) == "pause_s=0.004, n_partial=1, in_flight_finished=3"
