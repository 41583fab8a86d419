"""The faust monitor's clean-up (ops/monitor_faust.py), against the real mode/faust library."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("faust")

# A service thread whose stop waits for ever, as faust's consumer thread did when the run's
# embedded broker died while the monitor's worker was stopping (CI, 2026-11-26).
STUCK = textwrap.dedent(
    """
    import asyncio
    from mode import Service
    from mode.threads import ServiceThread

    class Stuck(ServiceThread):
        async def on_thread_stop(self):
            await asyncio.Event().wait()

        @Service.task
        async def _fetches(self):
            await asyncio.Queue().get()

    async def main():
        s = Stuck()
        await s.start()
        try:
            await asyncio.wait_for(s.stop(), 1.0)
        except asyncio.TimeoutError:
            pass

    asyncio.run(main())
    from asyncrl.ops.monitor_faust import _end_leftover_threads
    _end_leftover_threads()
    print("returned")
    """
)


def test_a_service_thread_left_running_no_longer_holds_the_process_open():
    """The worker had returned and the monitor printed its table, but a non-daemon service
    thread still waiting on the gone broker kept the process from exiting. Ended, it does so
    in silence: its coroutines, closed unfinished, printed a page of tracebacks."""
    done = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "returned"
    assert done.stderr == ""


# A service thread whose stop ends on an error, as faust's consumer thread's did when the run's
# embedded broker went just as the monitor, having read the whole run, stopped its worker: the
# fetch being closed was cancelled mid-retry (CI, 2026-11-29). A plain thread's error after it.
CRASHING_STOP = textwrap.dedent(
    """
    import asyncio, threading
    from mode.threads import ServiceThread
    from asyncrl.ops.monitor_faust import _quiet_stop

    class ClosingFetch(ServiceThread):
        async def on_thread_stop(self):
            raise asyncio.CancelledError()

    async def main():
        s = ClosingFetch()
        await s.start()
        _quiet_stop()
        try:
            await asyncio.wait_for(s.stop(), 2.0)  # the thread ended without saying so
        except asyncio.TimeoutError:
            pass
        s._thread.join(5)

    asyncio.run(main())
    print("returned")

    def fails():
        raise RuntimeError("not faust's")

    t = threading.Thread(target=fails)
    t.start()
    t.join()
    """
)


def test_a_service_thread_ending_on_an_error_at_the_monitors_stop_prints_no_traceback():
    """The monitor prints its table and nothing else: faust's threads ending on an error as
    the broker goes print no traceback, while any other thread's error is still shown."""
    done = subprocess.run(
        [sys.executable, "-c", CRASHING_STOP], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "returned"
    assert "CancelledError" not in done.stderr, done.stderr[-2000:]
    assert "RuntimeError: not faust's" in done.stderr
