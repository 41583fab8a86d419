"""What the trainer reads and writes, as one injected object: samples in, step records and
control events out, the weight transport's sending end. ``kafka_io`` builds it over Kafka and
the collective; ``asyncrl.testing.trainer_io`` in memory."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from asyncrl.config import RunConfig
from asyncrl.kafka import Publisher, Reader
from asyncrl.kafka.interfaces import Sink, Source
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import Sample, decode_sample
from asyncrl.sync.channel import ControlChannel, last_logged_version
from asyncrl.sync.transport import WeightSource, make_source


@dataclass
class TrainerIO:
    samples: Source[Sample]
    publisher: Sink
    control: ControlChannel
    weights: Callable[[torch.device], WeightSource | None]
    """Builds the weight transport's sending end (its rendezvous listens from then on)."""
    last_logged_version: Callable[[], int]
    """The highest weight version on the run's log (-1: none), for a restarted trainer."""
    control_history: Callable[[], list[ev.ControlEvent]] = list
    """The run's control events so far, in log order: the earlier trainers' versions, which a
    restarted trainer places on the version lineage (none: its own only)."""

    def close(self) -> None:
        self.samples.close()
        self.control.close()


def kafka_io(cfg: RunConfig, bootstrap: str) -> TrainerIO:
    """Over Kafka (the trainer's consumer group reads ``samples``; undecodable records go to
    ``dead-letter``) and the weight collective."""
    publisher = Publisher(cfg.kafka, bootstrap)
    samples: Reader[Sample] = Reader(
        cfg.kafka,
        bootstrap,
        decode_sample,
        group_id=f"{cfg.run_id}.trainer",
        dead_letter=(publisher, cfg.topic("dead-letter")),
    )
    return TrainerIO(
        samples=samples,
        publisher=publisher,
        control=ControlChannel.connect(cfg, bootstrap, publisher),
        weights=functools.partial(make_source, cfg),
        last_logged_version=functools.partial(last_logged_version, cfg, bootstrap),
        control_history=functools.partial(control_history, cfg, bootstrap),
    )


def control_history(cfg: RunConfig, bootstrap: str) -> list[ev.ControlEvent]:
    """The run's control events in log order (those that do not decode left out)."""
    from asyncrl.kafka.records import read_records
    from asyncrl.schemas import DecodeError

    events = []
    for rec in read_records(cfg, bootstrap, "control"):
        try:
            events.append(ev.decode_event(rec.value, rec.headers))
        except DecodeError:
            continue
    return events
