"""Live progress of a run, read back from its ``steps`` topic (so any process can show it).

A progress bar over the training steps with the latest step, version, reward, held-out
accuracy, samples/s, stale count, idle ratios and how full the rollout engine ran; each
evaluation also prints a line, so the log of a non-interactive run still tells the story.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from asyncrl.config import RunConfig
from asyncrl.schemas.step import StepRecord

PIPED_WIDTH = 160
"""Columns of output written to a pipe or file (``asyncrl run | tee run.log``, ``inspect ... |
less``, ``bench ... > bench.log``), where rich would assume 80 and fold every line and cell;
COLUMNS, when set, wins."""


def wide_console() -> Console:
    """A console at the terminal's width, or ``PIPED_WIDTH`` off a terminal."""
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=PIPED_WIDTH) if piped else Console()


@contextlib.contextmanager
def records_shown(console: Console, start: str, prefix: str) -> Iterator[None]:
    """A transient live line on ``console``, on a terminal only, while the block reads or
    writes many records (``asyncrl.kafka.records.reporting_progress``): "``start``" first,
    then "``prefix``: demo.prompts: 1,204,000 records" as the block reports."""
    from rich.progress import SpinnerColumn

    from asyncrl.kafka.records import reporting_progress

    if not console.is_terminal:
        yield
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as shown:
        task = shown.add_task(start)

        def report(what: str, records: int) -> None:
            shown.update(task, description=f"{prefix}: {what}: {records:,} records")

        with reporting_progress(report):
            yield


def counts_text(counts: dict) -> str:
    """``{"stale": 3}`` as "stale 3", and an empty one as "none" (not "dropped {}"), for the
    run summary and the report."""
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


class StepProgress:
    def __init__(self, cfg: RunConfig, console: Console) -> None:
        self.console = console
        self.total = cfg.trainer.total_training_steps
        self.accuracy: float | None = None
        self.stale = 0
        self.last_step = 0
        """The latest step shown."""
        self.reward_failures = 0
        """Trajectories whose reward function failed (raised, timed out), over the run."""
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("waiting for the first step", total=self.total)

    def __enter__(self) -> StepProgress:
        self.progress.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.__exit__(exc_type, exc, tb)

    def update(self, rec: StepRecord, earlier: bool = False) -> None:
        """Show one step of the run; ``earlier``: a step of an earlier launch of a resumed run,
        read back from its log, which moves the bar and prints nothing."""
        m = rec.metrics
        self.last_step = max(self.last_step, rec.step)
        self.reward_failures += int(m.get("reward/failures", 0))
        # verl's counter is the run's running total: the latest value is the count so far.
        self.stale = int(m.get("fully_async/count/stale_samples_processed", self.stale))
        if "val/accuracy" in m:
            self.accuracy = m["val/accuracy"]
        if "val/accuracy" in m and not earlier:
            tools = (
                f"  tool use {m['val/tool_use']:.2f} (rollout {_fmt(m.get('agent/tool_use_rate'))}, "
                f"errors/traj {_fmt(m.get('agent/tool_errors/mean'))})"
                if "val/tool_use" in m
                else ""
            )
            self.console.log(
                f"step {rec.step:4d}  version {rec.version:4d}  "
                f"held-out accuracy {self.accuracy:.3f}  "
                f"reward {_fmt(m.get('critic/score/mean'))}  "
                f"samples/s {_fmt(m.get('perf/samples_per_s'), '.1f')}{tools}"
            )
        desc = (
            f"v{rec.version} reward {_fmt(m.get('critic/score/mean'))} "
            f"acc {_fmt(self.accuracy)} {_fmt(m.get('perf/samples_per_s'), '.1f')} samples/s "
            f"stale {self.stale} idle trainer {_fmt(m.get('trainer/idle_ratio'))} "
            f"rollout {_fmt(m.get('rollouter/idle_ratio'))} "
            f"engine full {_fmt(m.get('rollouter/engine_occupancy'))}"
            + (f" [red]reward failures {self.reward_failures}[/]" if self.reward_failures else "")
        )
        self.progress.update(self.task, completed=rec.step, description=desc)

    def resumed(self) -> None:
        """The earlier launches' steps are all read: one line says where this launch goes on."""
        self.console.log(
            f"resumed: steps 1-{self.last_step} are on the log from an earlier launch "
            f"(held-out accuracy {_fmt(self.accuracy)}); the trainer goes on from its last "
            "checkpoint"
        )
