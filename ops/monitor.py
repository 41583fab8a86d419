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

import logging
import time
from collections import Counter

from rich.console import Console
from rich.live import Live

from asyncrl.config import RunConfig
from asyncrl.ops.monitor_stats import RunMonitor, before, feed

TOPICS = ("control", "steps", "dead-letter", "samples")
"""The topics read, in the order their ends are taken (``watermarks``): those whose records
name samples (a step's batch, a drop) before ``samples``, so each sample a record below its
end names is below the end of ``samples`` too, though the run writes on between two of them."""

HEALTH_LOG = "asyncrl.kafka.health"
"""The logger of the clients' broker warnings; quiet once the run has finished, when its
embedded broker stops with the launcher and a failed reconnect is no news."""


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
            from asyncrl.ops import monitor_faust  # noqa: F401 (a missing faust is said here)
        except ImportError as err:
            raise RuntimeError(
                f"the faust monitor needs faust-streaming ({err}): pip install 'asyncrl[monitor]',"
                " or use --engine kafka"
            ) from err
    mon = RunMonitor()
    topics = [cfg.topic(name) for name in TOPICS]
    level = logging.getLogger(HEALTH_LOG).level  # _read raises it once the run has finished
    try:
        _follow(mon, cfg, bootstrap, engine, topics, console, follow, refresh_s, idle_exit_s)
    finally:
        logging.getLogger(HEALTH_LOG).setLevel(level)
    return mon


def _follow(mon, cfg, bootstrap, engine, topics, console, follow, refresh_s, idle_exit_s) -> None:
    from asyncrl.kafka import Reader, raw_decode

    with Reader(cfg.kafka, bootstrap, raw_decode) as reader:
        _watch(mon, cfg, reader, bootstrap, engine, topics, console, follow, refresh_s, idle_exit_s)


def _watch(
    mon, cfg, reader, bootstrap, engine, topics, console, follow, refresh_s, idle_exit_s
) -> None:
    """Take the topics' ends with ``reader``, then read them with ``engine`` into ``mon``."""
    marks = watermarks(reader, cfg)
    ends = {topic: sum(high - low for low, high in m.values()) for topic, m in marks.items()}
    # Not following: the log as it was now, not the records a live run adds while the topics
    # are read (a --once of a live run printed 'published 298 trained 352 queue lag -54': the
    # samples read to their end before the steps the run went on writing).
    limits = None if follow else {t: {p: hi for p, (_, hi) in m.items()} for t, m in marks.items()}
    if engine == "faust":
        reader.close()  # not read from: its connections would fail aloud as the broker ends
    with Live(mon.render(cfg.run_id), console=console, refresh_per_second=4) as live:
        if engine == "faust":
            from asyncrl.ops import monitor_faust

            monitor_faust.read(
                mon, cfg, bootstrap, topics, ends, live, follow, refresh_s, idle_exit_s, limits
            )
        else:
            _read(mon, cfg, reader, topics, ends, live, follow, refresh_s, idle_exit_s, limits)
        live.update(mon.render(cfg.run_id))


def watermarks(reader, cfg: RunConfig) -> dict[str, dict[int, tuple[int, int]]]:
    """Each monitored topic's ``{partition: (low, high)}`` now, in ``TOPICS``' order."""
    return {cfg.topic(name): reader.watermarks(cfg.topic(name), exact=True) for name in TOPICS}


def _read(
    mon, cfg, reader, topics, ends, live, follow, refresh_s, idle_exit_s, limits=None
) -> None:
    """The plain backend: poll the assigned topics, feed, redraw. ``limits``: per topic and
    partition, the offset to stop before (the records past it are left out)."""
    for topic in topics:
        reader.assign(topic)
    seen: Counter = Counter()
    last_record = time.monotonic()
    while True:
        records = [r for r in reader.poll(refresh_s) if before(limits, r)]
        if records:
            last_record = time.monotonic()
            feed(mon, cfg, records)
            seen.update(r.topic for r in records)
            live.update(mon.render(cfg.run_id))
            if mon.finished:
                # The run is over: its embedded broker stops with the launcher, and the
                # reader's failed reconnects are expected, not news (every monitor of a run
                # that ended printed a librdkafka FAIL warning among its last lines).
                logging.getLogger(HEALTH_LOG).setLevel(logging.ERROR)
        caught_up = all(seen[t] >= n for t, n in ends.items())
        if not follow and caught_up:
            break
        if mon.finished and caught_up and not records:
            break
        if idle_exit_s is not None and time.monotonic() - last_record > idle_exit_s:
            break
