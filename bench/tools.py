"""``asyncrl bench tools``: what a calculator call costs, sandbox server vs a fresh interpreter.

The run's calculator tool (``multi_turn.tool_config_path``, default the shipped one) is built
twice, with ``fresh_interpreter`` false (the sandbox server forks a child per call) and true
(a new ``python -I -S`` per call). For each, measured one after the other in this process:

- ``one call``: median latency of calls made one at a time (an idle machine's cost per call);
- ``a step's calls``: a burst of ``rollout.n x max_concurrent_samples`` calls through the
  worker's ``ToolExecutor`` at once, as when a step's trajectories reach their call together:
  the burst's wall time and the mean latency a trajectory saw (queueing included).

The limits are the same either way (docs/agent.md); only the cost of making a sandbox differs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.config import load_config

WAYS = {"sandbox server (fork)": False, "fresh interpreter": True}
ONE_AT_A_TIME = 30
REPEATS = 3


def _calculator(tool_config: Path, fresh: bool) -> Any:
    from asyncrl.producers.tools.calculator import CalculatorTool
    from asyncrl.producers.tools.registry import load_tools

    tool = next(t for t in load_tools(tool_config).values() if isinstance(t, CalculatorTool))
    tool.fresh_interpreter = fresh
    return tool


def tools(config: str | None, overrides: list[str], console: Console) -> dict[str, Any]:
    """Measure both ways; print one table and return the figures."""
    import asyncio

    from asyncrl.producers.tools.base import ToolCall
    from asyncrl.producers.tools.registry import ToolExecutor, shipped_tools_path

    cfg = load_config(config, overrides)
    rollout = cfg.actor_rollout_ref.rollout
    tool_config = Path(rollout.multi_turn.tool_config_path or shipped_tools_path())
    burst = rollout.n * rollout.max_concurrent_samples
    calls = [
        ToolCall("calculator", {"expression": f"{100 + i}*{10 + i % 90}"}) for i in range(burst)
    ]
    results: dict[str, dict[str, float]] = {}
    for way, fresh in WAYS.items():
        console.rule(
            f"{way}: {ONE_AT_A_TIME} calls one at a time, then {REPEATS} x {burst} at once"
        )
        tool = _calculator(tool_config, fresh)
        asyncio.run(tool.call(calls[0]))  # warm: the server starts on first use
        single = [asyncio.run(tool.call(c)).seconds for c in calls[:ONE_AT_A_TIME]]
        walls, latencies = [], []
        with ToolExecutor({tool.name: tool}) as executor:
            for _ in range(REPEATS):
                t0 = time.monotonic()
                out = executor.run(calls)
                walls.append(time.monotonic() - t0)
                latencies.append(statistics.mean(r.seconds for r in out))
                if not all(r.ok for r in out):
                    raise RuntimeError(f"{way}: a call failed: {next(r for r in out if not r.ok)}")
        results[way] = {
            "one_call_ms": statistics.median(single) * 1e3,
            "burst_wall_s": statistics.median(walls),
            "burst_latency_s": statistics.median(latencies),
            "burst_calls": burst,
        }

    fork, fresh_ = results["sandbox server (fork)"], results["fresh interpreter"]
    table = Table(title=f"calculator calls ({burst} at once = rollout.n x max_concurrent_samples)")
    for col in ("sandbox", "one call, ms", f"{burst} calls, wall s", "latency in a burst, s"):
        table.add_column(col, justify="right")
    for way, r in results.items():
        table.add_row(
            way,
            f"{r['one_call_ms']:.1f}",
            f"{r['burst_wall_s']:.3f}",
            f"{r['burst_latency_s']:.3f}",
        )
    table.add_row(
        "fresh / fork",
        f"{fresh_['one_call_ms'] / fork['one_call_ms']:.1f}x",
        f"{fresh_['burst_wall_s'] / fork['burst_wall_s']:.1f}x",
        f"{fresh_['burst_latency_s'] / fork['burst_latency_s']:.1f}x",
    )
    console.print(table)
    figures = Path(cfg.output_dir) / f"bench-tools-{time.strftime('%Y%m%d-%H%M%S')}.json"
    figures.parent.mkdir(parents=True, exist_ok=True)
    figures.write_text(json.dumps(results, indent=1))
    console.print(f"figures: {figures}")
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``asyncrl bench tools``: its description (it takes no flags of its own)."""
    p.description = (
        "Latency of a calculator call, one at a time and a step's burst, with the sandbox "
        "server forking a child per call vs a fresh interpreter per call."
    )


def main(args: argparse.Namespace, console: Console) -> None:
    tools(args.config, args.overrides, console)
