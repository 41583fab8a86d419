"""The monitor's faust-streaming backend: one agent over the run's topics feeds ``RunMonitor``.

faust needs a consumer group (a fresh one per monitor, reading from the beginning) and creates
its assignor topic ``<app id>-__assignor-__leader`` on the cluster; it holds no tables, so no
changelog topic, and its data directory is a temporary one (faust's default is
``<app id>-data`` in the working directory). The group's rebalance and session timeouts are set low (5 s / 6 s): with
faust's defaults, Tansu holds the first join for 30 s. Values are read raw and decoded with
the project's Arrow decoders, never with pickle.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import tempfile
import time
import uuid
from collections import Counter
from typing import Any

from rich.live import Live

from asyncrl.config import RunConfig
from asyncrl.kafka import Record
from asyncrl.ops.monitor_stats import RunMonitor, feed


def read(
    mon: RunMonitor,
    cfg: RunConfig,
    bootstrap: str,
    topics: list[str],
    ends: dict[str, int],
    live: Live,
    follow: bool,
    refresh_s: float,
    idle_exit_s: float | None,
) -> None:
    """Run a faust worker until the run has finished and every record is read (or not
    ``follow`` and caught up, or ``idle_exit_s`` without a record)."""
    import faust

    logging.getLogger("faust").setLevel(logging.WARNING)
    logging.getLogger("mode").setLevel(logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    datadir = tempfile.TemporaryDirectory(prefix="asyncrl-monitor-")
    app = faust.App(
        f"asyncrl-monitor-{cfg.run_id}-{uuid.uuid4().hex[:8]}",
        broker=f"kafka://{bootstrap}",
        datadir=datadir.name,
        store="memory://",
        web_enabled=False,
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        broker_rebalance_timeout=5.0,
        broker_session_timeout=6.0,
        topic_replication_factor=1,
        topic_allow_declare=False,
    )
    channel = app.topic(*topics, key_serializer="raw", value_serializer="raw")
    seen: Counter = Counter()
    state: dict[str, Any] = {"last": time.monotonic(), "done": False}

    @app.agent(channel)
    async def consume(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            feed(mon, cfg, [_record(msg)])
            seen[msg.topic] += 1
            state["last"] = time.monotonic()

    worker = faust.Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False)

    @app.timer(refresh_s)
    async def refresh() -> None:
        live.update(mon.render(cfg.run_id))
        caught_up = all(seen[t] >= n for t, n in ends.items())
        idle = time.monotonic() - state["last"]
        if (
            (not follow and caught_up)
            or (mon.finished and caught_up)
            or (idle_exit_s is not None and idle > idle_exit_s)
        ) and not state["done"]:
            state["done"] = True
            asyncio.ensure_future(worker.stop())  # from a timer: inside the agent it deadlocks

    with datadir, contextlib.suppress(SystemExit):  # the worker exits when stopped
        worker.execute_from_commandline()
    from faust.utils.terminal.spinners import Spinner

    atexit.unregister(Spinner._finish)  # faust's spinner would write to a closed stdout at exit


def _record(msg: Any) -> Record[bytes | None]:
    headers = msg.headers or {}
    if not isinstance(headers, dict):
        headers = dict(headers)
    return Record(
        topic=msg.topic,
        partition=msg.partition,
        offset=msg.offset,
        key=msg.key.decode(errors="replace") if msg.key is not None else None,
        timestamp_ms=int(msg.timestamp * 1000),
        headers={k: bytes(v) for k, v in headers.items()},
        value=msg.value,
    )
