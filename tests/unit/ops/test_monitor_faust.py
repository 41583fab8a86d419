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
