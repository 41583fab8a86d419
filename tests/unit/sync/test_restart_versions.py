"""A restarted trainer's version is above every version a trainer named on the log, including
one a restarted trainer named (TrainerResumed) and died before publishing."""

from __future__ import annotations

from asyncrl.schemas import control as ev
from asyncrl.sync.channel import highest_version


def test_a_version_a_dead_restart_named_is_not_taken_again() -> None:
    """Role by role: the trainer SIGKILLed at step 8, started again, and SIGKILLed again as
    the worker joined it (its TrainerResumed(3) on the log, no WeightsPublished(3)). The third
    trainer took version 3 again: the audit failed (a version regression, twice in a run)."""
    log = [
        ev.SyncRequested(run_id="r", version=2, step=8),
        ev.WeightsPublished(run_id="r", version=2, step=8),
        ev.TrainerResumed(run_id="r", version=3, step=6, checkpoint_version=2),
    ]
    assert highest_version(log) == 3  # the next trainer publishes 4
    assert highest_version(log[:2]) == 2
    assert highest_version([]) == -1
