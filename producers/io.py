"""What a rollout worker reads and writes, as one injected object: prompts in (as a member of
the workers' group), samples and partials out, the control channel, the weight transport's
receiving end, and a scan of the log for recovery. ``kafka_io`` builds it over Kafka and the
collective; ``asyncrl.testing.worker_io`` in memory (the trainer's side is ``consumers.io``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from asyncrl.config import RunConfig
from asyncrl.kafka import Publisher, Record
from asyncrl.kafka.interfaces import Sink
from asyncrl.kafka.records import LogScan, log_scan
from asyncrl.producers.prompt_source import PromptSource
from asyncrl.schemas.prompt import PromptRecord
from asyncrl.sync.channel import ControlChannel
from asyncrl.sync.transport import WeightSink, make_sink

OnAssign = Callable[[set[int]], None]
"""Called with prompt partitions newly assigned to this worker."""
OnRevoke = Callable[[set[int], bool], None]
"""Called with prompt partitions moving away, and whether they are lost already."""


class PromptFeed(Protocol):
    """This worker's share of the ``prompts`` topic (``prompt_source.PromptSource`` over Kafka):
    a prompt's offset is committed only once ``done`` says its sample is on the log."""

    def keep_alive(self) -> None:
        """Poll without taking anything (stays in the group while the worker is busy)."""
        ...

    def take(self, timeout: float) -> Record[PromptRecord] | None: ...

    def take_where(
        self, wanted: Callable[[Record[PromptRecord]], bool]
    ) -> Record[PromptRecord] | None:
        """The first prompt already buffered that ``wanted`` accepts, out of order."""
        ...

    def done(self, rec: Record[PromptRecord]) -> None: ...

    def close(self) -> None:
        """Commit what is done and leave; what is open goes to the next owner."""
        ...


@dataclass
class WorkerIO:
    publisher: Sink
    """Samples, partials (and dead-letter copies of bad prompts)."""
    control: ControlChannel
    prompts: Callable[[OnAssign, OnRevoke], PromptFeed]
    """Joins the prompts group, with the worker's hand-back callbacks."""
    weights: Callable[[torch.device], WeightSink]
    """Builds the weight transport's receiving end for a model on that device (per join)."""
    scan_log: LogScan
    """Reads the run's ``samples`` and ``partials`` back (the recovery index)."""

    def close(self) -> None:
        self.control.close()


def kafka_io(cfg: RunConfig, bootstrap: str, worker: int) -> WorkerIO:
    """Over Kafka (the ``rollout`` consumer group reads ``prompts``; undecodable prompts go to
    ``dead-letter``) and the weight collective. The control channel stamps a fresh incarnation
    id on the worker's events: this process's lifetime (a restarted worker gets a new one)."""
    publisher = Publisher(cfg.kafka, bootstrap)

    def prompts(on_assign: OnAssign, on_revoke: OnRevoke) -> PromptFeed:
        return PromptSource(
            cfg,
            bootstrap,
            dead_letter=(publisher, cfg.topic("dead-letter")),
            on_assign=on_assign,
            on_revoke=on_revoke,
        )

    return WorkerIO(
        publisher=publisher,
        control=ControlChannel.connect(
            cfg, bootstrap, publisher, worker=worker, incarnation=uuid.uuid4().hex[:12]
        ),
        prompts=prompts,
        weights=lambda device: make_sink(cfg, device),
        scan_log=log_scan(cfg, bootstrap),
    )
