"""Metric definitions against hand-computed values on scripted timelines (no real clock)."""

import pytest

from asyncrl.consumers.step_stats import staleness_metrics
from asyncrl.telemetry.metrics import LevelClock, WaitClock


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_trainer_idle_ratio_covers_every_wait_of_the_window():
    """Window 100 -> 110 s; the trainer waits 100-102 (for samples) and 107-110 (for the
    workers to pause). Idle = 5 / 10 = 0.5. Counting only the last pause, as verl's known bug
    does, would give 3 / 10."""
    clock = Clock()
    wc = WaitClock(clock)
    with wc.waiting():
        clock.t = 102.0
    clock.t = 107.0
    with wc.waiting():
        clock.t = 110.0
    ratio, span = wc.close_window()
    assert span == pytest.approx(10.0)
    assert ratio == pytest.approx(0.5)
    # The next window starts at 110 with nothing waited yet: 4 s busy -> 0.
    clock.t = 114.0
    assert wc.close_window() == (pytest.approx(0.0), pytest.approx(4.0))


def test_rollouter_idle_ratio_spans_windows():
    """Idle 100-101 and 104-(window end at 106): 3 / 6 = 0.5; the idle stretch still open at
    the window's end carries over: 106-108 idle, 108-110 busy -> 2 / 4 = 0.5."""
    clock = Clock()
    ic = WaitClock(clock)
    ic.set_waiting(True)
    clock.t = 101.0
    ic.set_waiting(False)
    clock.t = 104.0
    ic.set_waiting(True)
    clock.t = 106.0
    assert ic.close_window() == (pytest.approx(0.5), pytest.approx(6.0))
    clock.t = 108.0
    ic.set_waiting(False)
    clock.t = 110.0
    assert ic.close_window() == (pytest.approx(0.5), pytest.approx(4.0))


def test_engine_occupancy_is_the_time_weighted_level_of_each_window():
    """Full (1.0) 100-104, a quarter full 104-108, empty 108-110: (4 + 1 + 0) / 10 = 0.5.
    The level set last holds into the next window: a quarter from 110 to 114 -> 0.25."""
    clock = Clock()
    level = LevelClock(clock)
    level.set(1.0)
    clock.t = 104.0
    level.set(0.25)
    clock.t = 108.0
    level.set(0.0)
    clock.t = 110.0
    level.set(0.25)
    assert level.close_window() == (pytest.approx(0.5), pytest.approx(10.0))
    clock.t = 114.0
    assert level.close_window() == (pytest.approx(0.25), pytest.approx(4.0))


def test_staleness_metrics():
    """Trainer at version 5 consumes samples of versions 5, 5, 4, 3: staleness 0, 0, 1, 2."""
    m = staleness_metrics([0, 0, 1, 2])
    assert m["fully_async/staleness/mean"] == pytest.approx(0.75)
    assert m["fully_async/staleness/max"] == 2.0
    assert {k: v for k, v in m.items() if "count_" in k} == {
        "fully_async/staleness/count_0": 2.0,
        "fully_async/staleness/count_1": 1.0,
        "fully_async/staleness/count_2": 1.0,
    }


def test_tensorboard_scalars_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from asyncrl.config import load_config
    from asyncrl.telemetry.metrics import TensorBoardWriter

    cfg = load_config(overrides=["trainer.logger=[console,tensorboard]"])
    assert cfg.trainer.logger == ["console", "tensorboard"]
    w = TensorBoardWriter(tmp_path)
    w.write(1, {"trainer/idle_ratio": 0.5, "critic/score/mean": 0.25})
    w.write(2, {"trainer/idle_ratio": 0.25})
    w.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    idle = [(e.step, e.value) for e in acc.Scalars("trainer/idle_ratio")]
    assert idle == [(1, 0.5), (2, 0.25)]
    assert [e.value for e in acc.Scalars("critic/score/mean")] == [0.25]
