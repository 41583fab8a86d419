"""``asyncrl monitor``: a run's health, live, from its topics alone (off the training path).

A separate process reads ``samples``, ``steps``, ``control`` and ``dead-letter`` from the
beginning (no consumer group: it never moves anyone's offsets) and keeps aggregates per
weight version current in the terminal:

- produced: samples published under the version (``param_version``), their mean reward and
  partial ratio (samples continued across a sync);
- consumed: samples trained on at the version, how many were stale, the staleness spread;
- the trainer's held-out accuracy and idle ratio, the rollouters' idle ratio at that sync;
- run-wide: queue lag (published, not yet trained on or dropped), dead-lettered records,
  workers that joined and left.

Two backends feed the same aggregates: a faust-streaming agent (``monitor_faust``, used when
faust is installed) and a plain confluent-kafka ``Reader`` (``engine="kafka"``: no consumer
group, no topic created, starts faster).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from asyncrl.config import RunConfig
from asyncrl.schemas import DecodeError
from asyncrl.schemas import control as ev
from asyncrl.schemas.sample import Sample, decode_sample
from asyncrl.schemas.step import StepRecord, decode_step
from asyncrl.telemetry.metrics import stale_in_step

TOPICS = ("samples", "steps", "control", "dead-letter")


@dataclass
class VersionStats:
    produced: int = 0
    reward_sum: float = 0.0
    trajectories: int = 0
    partial: int = 0
    consumed: int = 0
    stale: int = 0
    staleness: Counter = field(default_factory=Counter)
    accuracy: float | None = None
    trainer_idle: float | None = None
    rollouter_idle: dict[int, float] = field(default_factory=dict)


class RunMonitor:
    """The aggregates; fed one decoded record at a time, so they can be tested without Kafka."""

    def __init__(self) -> None:
        self.versions: dict[int, VersionStats] = defaultdict(VersionStats)
        self.published = 0
        self.trained = 0
        self.dropped = 0
        self.dead_letters = 0
        self.undecodable = 0
        self.steps = 0
        self.workers: dict[int, str] = {}
        self.left: list[str] = []
        self.finished: str | None = None

    @property
    def lag(self) -> int:
        """Samples published but not yet trained on or dropped by the trainer."""
        return self.published - self.trained - self.dropped

    def add_sample(self, s: Sample) -> None:
        v = self.versions[s.param_version]
        v.produced += 1
        v.reward_sum += sum(s.rewards)
        v.trajectories += len(s.trajectories)
        v.partial += any(t.span > 0 for t in s.trajectories)
        self.published += 1

    def add_step(self, rec: StepRecord) -> None:
        m = rec.metrics
        v = self.versions[rec.version]
        v.consumed += len(rec.sample_ids)
        v.stale += stale_in_step(m)  # this step's (verl's stale_samples_processed is a total)
        for key, n in m.items():
            if key.startswith("fully_async/staleness/count_"):
                v.staleness[int(key.rsplit("_", 1)[1])] += int(n)
        if "val/accuracy" in m:
            v.accuracy = m["val/accuracy"]
        if "trainer/idle_ratio" in m:
            v.trainer_idle = m["trainer/idle_ratio"]
        self.trained += len(rec.sample_ids)
        self.steps = max(self.steps, rec.step)

    def add_event(self, e: ev.ControlEvent) -> None:
        if isinstance(e, ev.RolloutResumed):
            self.versions[e.version].rollouter_idle[e.worker] = e.idle_ratio
        elif isinstance(e, ev.WorkerStarted):
            self.workers[e.worker] = e.incarnation
        elif isinstance(e, ev.WorkerStopped):
            self.left.append(f"worker {e.worker} ({e.reason})")
        elif isinstance(e, ev.SamplesDropped) and e.worker == ev.TRAINER:
            self.dropped += e.count
        elif isinstance(e, ev.RunFinished):
            self.finished = e.reason

    def render(self, run_id: str, last_versions: int = 12) -> Group:
        parts = [
            f"[bold]{run_id}[/]",
            f"step {self.steps}",
            f"published {self.published}",
            f"trained {self.trained}",
            f"queue lag {self.lag}",
            f"dropped {self.dropped}",
            f"dead-letter {self.dead_letters}",
            f"workers {len(self.workers)}"
            + (f", left: {'; '.join(self.left)}" if self.left else ""),
        ]
        if self.finished:
            parts.append(f"[green]finished: {self.finished}[/]")
        head = "   ".join(parts)  # a line that wraps on a narrow terminal, never cut short
        table = Table(
            title="per weight version (newest last)",
            caption="made: samples published under the version; used: trained on at it; "
            "0/1/2+: how many versions behind; idle T/R: trainer/rollouters",
        )
        for col in (
            "version", "made", "reward", "partial", "used", "stale", "0/1/2+", "acc",
            "idle T", "idle R",
        ):  # fmt: skip
            table.add_column(col, justify="right")
        for version in sorted(self.versions)[-last_versions:]:
            v = self.versions[version]
            st = v.staleness
            table.add_row(
                str(version),
                str(v.produced),
                _f(v.reward_sum / v.trajectories if v.trajectories else None),
                _f(v.partial / v.produced if v.produced else None),
                str(v.consumed),
                str(v.stale),
                f"{st[0]}/{st[1]}/{sum(n for k, n in st.items() if k >= 2)}" if st else "-",
                _f(v.accuracy, ".3f"),
                _f(v.trainer_idle),
                _f(
                    sum(v.rollouter_idle.values()) / len(v.rollouter_idle)
                    if v.rollouter_idle
                    else None
                ),
            )
        return Group(head, table)


def _f(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def feed(mon: RunMonitor, cfg: RunConfig, records: list[Any]) -> None:
    """Decode raw records by topic and hand them to the monitor; bad ones are only counted."""
    for rec in records:
        name = rec.topic.removeprefix(f"{cfg.run_id}.")
        try:
            if name == "samples":
                mon.add_sample(decode_sample(rec.value, rec.headers))
            elif name == "steps":
                mon.add_step(decode_step(rec.value, rec.headers))
            elif name == "control":
                mon.add_event(ev.decode_event(rec.value, rec.headers))
            elif name == "dead-letter":
                mon.dead_letters += 1
        except DecodeError:
            mon.undecodable += 1  # the trainer dead-letters them; the monitor only counts


def monitor(
    cfg: RunConfig,
    bootstrap: str,
    console: Console,
    follow: bool = True,
    refresh_s: float = 0.5,
    idle_exit_s: float | None = None,
    engine: str = "auto",
) -> RunMonitor:
    """Read the run's topics and keep the table current until RunFinished (or Ctrl-C).

    ``follow=False`` reads what is there now, prints once and returns. ``idle_exit_s`` stops
    after that long without a new record (for scripts). ``engine``: ``faust`` (a
    faust-streaming agent, ``pip install 'asyncrl[monitor]'``), ``kafka`` (a plain
    confluent-kafka reader, no consumer group), or ``auto``: faust when it is installed.
    """
    import importlib.util

    from asyncrl.kafka import Reader, raw_decode

    if engine not in ("auto", "faust", "kafka"):
        raise ValueError(f"monitor engine {engine!r}: choose auto, faust or kafka")
    secured = cfg.kafka.security.protocol != "PLAINTEXT"
    if engine == "faust" and secured:
        raise ValueError(
            "the faust monitor engine does not take kafka.security settings yet: use --engine kafka"
        )
    if engine == "auto":
        engine = "faust" if importlib.util.find_spec("faust") and not secured else "kafka"
        if engine == "kafka" and not secured:
            console.print("faust-streaming not installed ('asyncrl[monitor]'): plain Kafka reader")
    if engine == "faust":
        try:
            from asyncrl.ops import monitor_faust
        except ImportError as err:
            raise RuntimeError(
                f"the faust monitor needs faust-streaming ({err}): pip install 'asyncrl[monitor]',"
                " or use --engine kafka"
            ) from err
    mon = RunMonitor()
    topics = [cfg.topic(name) for name in TOPICS]
    with Reader(cfg.kafka, bootstrap, raw_decode) as reader:
        ends = {}
        for topic in topics:
            low_high = reader.watermarks(topic, exact=True).values()
            ends[topic] = sum(high - low for low, high in low_high)
        with Live(mon.render(cfg.run_id), console=console, refresh_per_second=4) as live:
            if engine == "faust":
                monitor_faust.read(
                    mon, cfg, bootstrap, topics, ends, live, follow, refresh_s, idle_exit_s
                )
            else:
                _read(mon, cfg, reader, topics, ends, live, follow, refresh_s, idle_exit_s)
            live.update(mon.render(cfg.run_id))
    return mon


def _read(mon, cfg, reader, topics, ends, live, follow, refresh_s, idle_exit_s) -> None:
    """The plain backend: poll the assigned topics, feed, redraw."""
    for topic in topics:
        reader.assign(topic)
    seen: Counter = Counter()
    last_record = time.monotonic()
    while True:
        records = reader.poll(refresh_s)
        if records:
            last_record = time.monotonic()
            feed(mon, cfg, records)
            seen.update(r.topic for r in records)
            live.update(mon.render(cfg.run_id))
        caught_up = all(seen[t] >= n for t, n in ends.items())
        if not follow and caught_up:
            break
        if mon.finished and caught_up and not records:
            break
        if idle_exit_s is not None and time.monotonic() - last_record > idle_exit_s:
            break
