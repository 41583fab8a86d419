"""The run's log as the audit reads it (``RunLog``), and the small readings of the control
log the checks and other commands share: who dropped what, whether the run finished.

``read_run_log`` is the only part that talks to a broker: every topic from its start, decoded
as it is read, and the rollout group's committed offsets. The checks (``ops/audit_checks.py``,
``ops/audit_budget.py``, ``ops/audit_staleness.py``) are pure functions of a ``RunLog``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.schemas import control as ev
from asyncrl.schemas.partial import PartialSample
from asyncrl.schemas.prompt import PromptRecord
from asyncrl.schemas.sample import Sample
from asyncrl.schemas.step import StepRecord


@dataclass
class RunLog:
    """A run's topics, decoded, each in log order."""

    prompts: list[PromptRecord] = field(default_factory=list)
    committed: set[str] = field(default_factory=set)
    """Sample ids of the prompts below the rollout group's committed offsets (taken, done)."""
    samples: list[Sample] = field(default_factory=list)
    partials: list[PartialSample] = field(default_factory=list)
    control: list[ev.ControlEvent] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    dead_letter: int = 0
    """Records on the dead-letter topic (not decoded: they are what failed to decode)."""
    undecodable: dict[str, int] = field(default_factory=dict)
    """Per topic, records that did not decode here (counted, left out of the checks)."""


def _of(events: Iterable[ev.ControlEvent], kind: type[ev.ControlEvent]) -> list:
    return [e for e in events if isinstance(e, kind)]


def _extra_copies(ids: Iterable[str]) -> list[str]:
    """Each id once per copy beyond its first."""
    return [i for i, n in Counter(ids).items() for _ in range(n - 1)]


def dropped_ids(control: list[ev.ControlEvent]) -> set[str]:
    """Sample ids named by a SamplesDropped (by the trainer, or by a worker at the run's end)."""
    return {sid for e in _of(control, ev.SamplesDropped) for sid in e.sample_ids}


def run_finished(control: list[ev.ControlEvent]) -> bool:
    """A RunFinished that no trainer restart followed (a trainer started again after one goes
    on with the run)."""
    return finishing_event(control) is not None


def finishing_event(control: Iterable[ev.ControlEvent]) -> ev.RunFinished | None:
    """The RunFinished that ends the run (``run_finished``), or None."""
    finished = None
    for e in control:
        if isinstance(e, ev.RunFinished):
            finished = e
        elif isinstance(e, ev.TrainerResumed):
            finished = None
    return finished


def read_control(cfg: RunConfig, bootstrap: str) -> list[ev.ControlEvent]:
    """The run's control events in log order, those that do not decode left out (a reader
    that needs only what the trainer and workers said: a restart, the run's end)."""
    from asyncrl.consumers.io import control_history

    return control_history(cfg, bootstrap)


class AuditError(RuntimeError):
    """The log could not be read (no such run on this broker, a broker that does not answer)."""


def read_run_log(cfg: RunConfig, bootstrap: str) -> RunLog:
    """Read every topic of ``cfg``'s run from its start to its current end, and the rollout
    group's committed offsets. A record that does not decode is counted, not fatal."""
    from confluent_kafka import KafkaException

    from asyncrl.kafka import Reader, UnknownTopic, raw_decode
    from asyncrl.kafka.records import read_records
    from asyncrl.schemas import DecodeError
    from asyncrl.schemas.partial import decode_partial
    from asyncrl.schemas.prompt import decode_prompt
    from asyncrl.schemas.sample import decode_sample
    from asyncrl.schemas.step import decode_step

    log = RunLog()

    def read(
        name: str, decode: Callable[[bytes | None, dict[str, bytes]], Any]
    ) -> list[tuple[tuple[int, int, int], Any]]:
        """((timestamp_ms, partition, offset), decoded) per record, decoded as it is read: a
        long run's prompts are millions of records, and holding them all raw before decoding
        took the audit of the 8k-step soak run to 5 GB."""
        out = []
        try:
            for rec in read_records(cfg, bootstrap, name):
                try:
                    out.append(
                        (
                            (rec.timestamp_ms, rec.partition, rec.offset),
                            decode(rec.value, rec.headers),
                        )
                    )
                except DecodeError:
                    log.undecodable[name] = log.undecodable.get(name, 0) + 1
        except UnknownTopic as err:
            raise AuditError(str(err)) from None
        except KafkaException as err:
            raise AuditError(f"cannot read {cfg.topic(name)} on {bootstrap}: {err}") from None
        if len({where[1] for where, _ in out}) > 1:  # log order across partitions: by time
            out.sort(key=lambda pair: pair[0])
        return out

    # kafka.topics.READ_ORDER: what refers to a record is read before it, so a live run's
    # log, read topic by topic while it grows, holds everything its records refer to.
    log.steps = [s for _, s in read("steps", decode_step)]
    log.partials = [p for _, p in read("partials", decode_partial)]
    log.samples = [s for _, s in read("samples", decode_sample)]
    prompts = read("prompts", decode_prompt)
    log.prompts = [p for _, p in prompts]
    log.control = [e for _, e in read("control", ev.decode_event)]
    log.dead_letter = len(read("dead-letter", raw_decode))

    topic = cfg.topic("prompts")
    with Reader(cfg.kafka, bootstrap, raw_decode, group_id=f"{cfg.run_id}.rollout") as group:
        committed = group.committed([(topic, p) for p in group.partitions(topic)])
    log.committed = {
        p.sample_id
        for (_ts, partition, offset), p in prompts
        if offset < (committed.get((topic, partition)) or 0)
    }
    return log
