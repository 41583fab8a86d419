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
import os
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter
from typing import Any

from rich.live import Live

from asyncrl.config import RunConfig
from asyncrl.kafka import Record
from asyncrl.kafka.health import accepts_connection
from asyncrl.ops.monitor_stats import RunMonitor, before, feed

GONE_IDLE_S = 3.0
"""No record for this long, and the broker is checked: an embedded broker dies with its run,
and faust's consumer, behind or still starting, would retry it for ever."""


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
    limits: dict[str, dict[int, int]] | None = None,
) -> None:
    """Run a faust worker until the run has finished and every record is read (or not
    ``follow`` and caught up, or ``idle_exit_s`` without a record). ``limits``: per topic
    and partition, the offset to stop before (ops/monitor.py)."""
    import faust

    levels = {name: logging.getLogger(name).level for name in NOISY}
    # mode's stop of a task cancelled mid-sleep, at every stop: nothing the user can act on
    warnings.filterwarnings("ignore", "coroutine 'sleep' was never awaited", RuntimeWarning)
    logging.getLogger("faust").setLevel(logging.WARNING)
    logging.getLogger("mode").setLevel(logging.WARNING)
    # Its connection errors, ten a second while a broker is gone: the timer checks the broker
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
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
            if not before(limits, msg):
                continue
            feed(mon, cfg, [_record(msg)])
            seen[msg.topic] += 1
            state["last"] = time.monotonic()

    worker = faust.Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False)

    @app.timer(refresh_s)
    async def refresh() -> None:
        live.update(mon.render(cfg.run_id))
        if state["done"]:
            return
        caught_up = all(seen[t] >= n for t, n in ends.items())
        idle = time.monotonic() - state["last"]
        if (
            (not follow and caught_up)
            or (mon.finished and caught_up)
            or (idle_exit_s is not None and idle > idle_exit_s)
        ):
            state["done"] = True
            _quiet_stop()
            asyncio.ensure_future(worker.stop())  # from a timer: inside the agent it deadlocks

    stopped = threading.Event()
    watch = threading.Thread(
        target=_watch_broker,
        args=(bootstrap, state, stopped, live, cfg.run_id),
        name="monitor-broker-watch",
        daemon=True,
    )
    watch.start()
    with datadir, contextlib.suppress(SystemExit):  # the worker exits when stopped
        try:
            worker.execute_from_commandline()
        finally:
            stopped.set()
            # A worker stopped as the broker ended leaves clients and tasks that complain as
            # they are destroyed, later: kept quiet then.
            if not _end_leftover_threads() and _reachable(bootstrap):
                for name, level in levels.items():
                    logging.getLogger(name).setLevel(level)
    from faust.utils.terminal.spinners import Spinner

    atexit.unregister(Spinner._finish)  # faust's spinner would write to a closed stdout at exit


NOISY = ("faust", "mode", "aiokafka", "asyncio")
"""The loggers a stopping faust worker without its broker fills with errors."""


def _quiet_loggers() -> None:
    for name in NOISY:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def _quiet_stop() -> None:
    """Before the monitor stops its worker, having read the whole run: a stop as the broker
    ends logs each cancelled agent as crashed, and the consumer's thread, closing a fetch
    cancelled mid-retry, ends on the error. Neither can lose a record the table shows, so
    faust's loggers and its service threads' tracebacks are silenced; other threads' are not."""
    from mode.threads import WorkerThread

    _quiet_loggers()
    shown = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if not isinstance(args.thread, WorkerThread):
            shown(args)

    threading.excepthook = hook


def _quiet() -> None:
    """Silence faust's loggers, its threads' tracebacks and those of its coroutines closed
    unfinished (the process is about to end)."""
    _quiet_loggers()
    threading.excepthook = lambda args: None
    sys.unraisablehook = lambda unraisable: None


LEFTOVER_GRACE_S = 2.0
"""How long a faust service thread may take to end after its worker has returned."""


def _end_leftover_threads() -> bool:
    """End the service threads a stopped faust worker left running. Its consumer's thread,
    stopping while the broker is gone, can wait on it for ever, and, being no daemon, would
    hold the process open after the monitor returns. Stopping the thread's event loop ends it
    (``run_until_complete`` raises, silenced with the rest of faust's noise). Returns whether
    any thread needed ending."""
    from mode.threads import WorkerThread

    ended = False
    for thread in threading.enumerate():
        if not isinstance(thread, WorkerThread) or not thread.is_alive():
            continue
        thread.join(LEFTOVER_GRACE_S)
        if thread.is_alive():
            _quiet()
            thread.service.on_crash = lambda *args, **kwargs: None  # type: ignore[method-assign]
            loop = thread.service.thread_loop
            loop.call_soon_threadsafe(loop.stop)
            thread.join(LEFTOVER_GRACE_S)
            ended = True
    return ended


def _watch_broker(
    bootstrap: str, state: dict[str, Any], stopped: threading.Event, live: Live, run_id: str
) -> None:
    """End the monitor when its broker is gone: once nothing arrived for ``GONE_IDLE_S`` and
    the broker refuses connections, say so and end the process. faust's worker cannot be
    stopped then (its consumer, or its start-up, waits on the broker for ever; signals too),
    so this thread, outside its event loop, ends it."""
    while not stopped.wait(1.0):
        if time.monotonic() - state["last"] < GONE_IDLE_S or _reachable(bootstrap):
            continue
        _quiet()
        live.console.print(
            f"[yellow]the broker at {bootstrap} is gone (an embedded broker ends with its run): "
            f"the monitor stops; `asyncrl inspect` and `asyncrl audit {run_id}` read the run's "
            "archive[/]"
        )
        live.stop()  # the table as last drawn, and the terminal's cursor back
        os._exit(0)


def _reachable(bootstrap: str, timeout_s: float = 0.5) -> bool:
    """Whether the first bootstrap address accepts a connection."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    return port.isdigit() and accepts_connection(host, int(port), timeout_s)


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
