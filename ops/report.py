"""``asyncrl report RUN``: PNG plots and a Markdown summary of a finished (or running) run.

Reads only the run's ``metrics.jsonl`` (the trainer's step rows, a row per completed sync,
the summary), so it works after the embedded broker is gone, on a copy of the directory, and
on a run still going. Writes into
``<run_dir>/report/``:

- ``reward_accuracy_step.png`` / ``reward_accuracy_time.png``: training reward per step and
  held-out accuracy at each evaluation, against the step and against the trainer's time (a
  run resumed after a kill: its launches joined, ``join_launches``);
- ``staleness.png``: how many versions behind each trained sample was (``version -
  param_version`` at consumption), summed over the run;
- ``idle_ratios.png``: trainer and rollouter idle ratio of each sync window;
- ``sync_time.png``: each sync from SyncRequested to the last RolloutResumed, split into the
  trainer's wait for the pauses, the transfer, and the rest (workers load and resume);
- ``throughput.png``: samples/s per step and the run's running average;
- ``tool_use.png`` (agent runs): share of trajectories calling a tool, in rollouts and on the
  held-out set, and tool errors per trajectory;
- ``offpolicy.png`` (runs with an off-policy option, issue 17): per step, the mismatch KL
  between rollout and trainer log-probs, the mean importance weight, the shares truncated,
  rejected and masked as stale, and the share of groups filtered by dynamic sampling;
- ``report.md``: the figures that matter, with the plots inlined.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.launch.progress import counts_text
from asyncrl.ops.plots import bar_plot, line_plot, stacked_bars

STALENESS_PREFIX = "fully_async/staleness/count_"


class ReportError(RuntimeError):
    """The run directory lacks what a report needs; the message says what and where."""


def resolve_run_dir(run: str, output_dir: str = "runs") -> Path:
    """RUN is a run directory, or a run_id under ``output_dir``."""
    for candidate in (Path(run), Path(output_dir) / run):
        if (candidate / "metrics.jsonl").exists():
            return candidate
    raise ReportError(
        f"no run at {run!r} or {Path(output_dir) / run}: expected a run directory holding "
        "metrics.jsonl (pass the directory, or a run_id with --output-dir)"
    )


def load_rows(
    run_dir: Path,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(per-step rows, per-sync rows, summary) of a run; the summary is {} while it runs."""
    rows, syncs, summary = [], [], {}
    with open(run_dir / "metrics.jsonl") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if "step" in row:
                rows.append(row)
            elif "sync" in row:
                syncs.append(row["sync"])
            elif "summary" in row:
                summary = row["summary"]
    if not rows:
        raise ReportError(f"{run_dir / 'metrics.jsonl'} holds no step yet")
    return join_launches(rows), syncs, summary


def join_launches(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step rows of a run resumed after a kill, as one run. Each launch's trainer counts
    ``perf/elapsed_s`` and its running ``perf/samples_per_s`` from its own start, and goes
    on from its last checkpoint, so the steps after it were done twice: the later row of a
    step replaces the earlier (the trainer voided it), elapsed time goes on from where the
    previous launch stopped, and samples/s is the whole run's so far. ``launch`` numbers
    each row's launch from 1."""
    joined: list[dict[str, Any]] = []
    offset = samples_before = 0.0
    prev_t = prev_samples = 0.0
    launch = 1
    for raw in rows:
        t = float(raw.get("perf/elapsed_s", 0.0))
        if t < prev_t:  # a new launch: its clock starts again
            launch += 1
            offset += prev_t
            samples_before += prev_samples
        samples = _trained(raw)
        prev_t, prev_samples = t, samples
        row = dict(raw, launch=launch)
        if "perf/elapsed_s" in raw:
            row["perf/elapsed_s"] = offset + t
            if "perf/samples_trained" in raw:
                row["perf/samples_trained"] = samples_before + samples
            if "perf/samples_per_s" in raw and launch > 1:  # the whole run's, start-ups in
                row["perf/samples_per_s"] = (samples_before + samples) / (offset + t)
        while joined and joined[-1]["step"] >= row["step"]:
            joined.pop()  # voided by the restart
        joined.append(row)
    return joined


def staleness_counts(rows: list[dict[str, Any]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(STALENESS_PREFIX):
                k = int(key.removeprefix(STALENESS_PREFIX))
                counts[k] = counts.get(k, 0) + int(value)
    return dict(sorted(counts.items()))


def sync_windows(rows: list[dict[str, Any]], syncs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """One entry per completed sync (the trainer logs a sync row once every worker resumed),
    with the idle ratios of the window it closed: those of the last step before its version."""
    last_step_of: dict[int, dict[str, Any]] = {}
    for row in rows:
        last_step_of[row["version"]] = row
    windows = []
    for sync in sorted(syncs, key=lambda s: s["version"]):
        before = last_step_of.get(sync["version"] - 1, {})
        windows.append(
            {
                **{k: float(v) for k, v in sync.items()},
                "trainer_idle": float(before.get("trainer/idle_ratio", float("nan"))),
                "rollouter_idle": float(before.get("rollouter/idle_ratio", float("nan"))),
                "rollouter_budget_idle": float(
                    before.get("rollouter/budget_idle_ratio", float("nan"))
                ),
                "engine_occupancy": float(before.get("rollouter/engine_occupancy", float("nan"))),
                "budget_unfilled": float(
                    before.get("rollouter/budget_unfilled_ratio", float("nan"))
                ),
            }
        )
    return windows


def write_report(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Draw every plot and write report.md; returns the report's path."""
    rows, syncs, summary = load_rows(run_dir)
    out = out_dir or run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    run_id = run_dir.name
    initial = summary.get("val/accuracy_initial")
    reward_step = [(r["step"], r["critic/score/mean"]) for r in rows if "critic/score/mean" in r]
    acc_step = [(r["step"], r["val/accuracy"]) for r in rows if "val/accuracy" in r]
    reward_time = [
        (r["perf/elapsed_s"], r["critic/score/mean"]) for r in rows if "critic/score/mean" in r
    ]
    acc_time = [(r["perf/elapsed_s"], r["val/accuracy"]) for r in rows if "val/accuracy" in r]
    if initial is not None:
        acc_step.insert(0, (0, initial))
        acc_time.insert(0, (0.0, initial))
    plots = {
        "reward and accuracy by step": line_plot(
            {"training reward (mean per step)": reward_step, "held-out accuracy": acc_step},
            out / "reward_accuracy_step.png",
            title=f"{run_id}: reward and accuracy",
            xlabel="step",
            ylabel="reward / accuracy",
        ),
        "reward and accuracy by wall time": line_plot(
            {"training reward (mean per step)": reward_time, "held-out accuracy": acc_time},
            out / "reward_accuracy_time.png",
            title=f"{run_id}: reward and accuracy",
            xlabel="seconds since the trainer started",
            ylabel="reward / accuracy",
        ),
    }
    counts = staleness_counts(rows)
    if counts:
        plots["staleness"] = bar_plot(
            {str(k): float(n) for k, n in counts.items()},
            out / "staleness.png",
            title=f"{run_id}: staleness of the trained samples",
            xlabel="versions behind the trainer when consumed",
            ylabel="samples",
        )
    windows = sync_windows(rows, syncs)
    if windows:
        versions = [w["version"] for w in windows]
        plots["idle ratios per sync window"] = line_plot(
            {
                "trainer/idle_ratio": [(w["version"], w["trainer_idle"]) for w in windows],
                "rollouter/idle_ratio": [(w["version"], w["rollouter_idle"]) for w in windows],
            },
            out / "idle_ratios.png",
            title=f"{run_id}: idle ratio of each sync window",
            xlabel="weight version the window ended with",
            ylabel="idle ratio",
        )
        plots["sync time"] = stacked_bars(
            versions,
            {
                "pause (wait for every worker)": [w["pause_s"] * 1e3 for w in windows],
                "transfer": [w["transfer_s"] * 1e3 for w in windows],
                "workers load and resume": [_rest(w) * 1e3 for w in windows],
            },
            out / "sync_time.png",
            title=f"{run_id}: time of each weight sync",
            xlabel="weight version published",
            ylabel="ms",
        )
    if any("agent/tool_use_rate" in r for r in rows):  # the agent loop
        tool_val = [(r["step"], r["val/tool_use"]) for r in rows if "val/tool_use" in r]
        if summary.get("val/tool_use_initial") is not None:
            tool_val.insert(0, (0, summary["val/tool_use_initial"]))
        plots["tool use"] = line_plot(
            {
                "rollouts: share of trajectories calling a tool": [
                    (r["step"], r["agent/tool_use_rate"])
                    for r in rows
                    if "agent/tool_use_rate" in r
                ],
                "held-out: share calling a tool": tool_val,
                "rollouts: tool errors per trajectory": [
                    (r["step"], r["agent/tool_errors/mean"])
                    for r in rows
                    if "agent/tool_errors/mean" in r
                ],
            },
            out / "tool_use.png",
            title=f"{run_id}: tool use of the agent loop",
            xlabel="step",
            ylabel="share / errors per trajectory",
        )
    series = offpolicy_series(rows)
    if series:
        plots["off-policy correction"] = line_plot(
            series,
            out / "offpolicy.png",
            title=f"{run_id}: off-policy correction and dynamic sampling",
            xlabel="step",
            ylabel="value per step",
        )
    rates = _step_rates(rows)
    plots["throughput"] = line_plot(
        {
            "samples/s over each step": rates,
            "running average": [(r["perf/elapsed_s"], r["perf/samples_per_s"]) for r in rows],
        },
        out / "throughput.png",
        title=f"{run_id}: throughput of the trainer",
        xlabel="seconds since the trainer started",
        ylabel="samples/s",
    )
    path = out / "report.md"
    path.write_text(_markdown(run_id, rows, summary, counts, windows, plots, out))
    return path


OFFPOLICY_SERIES = {
    "rollout_corr/kl": "KL(rollout || trainer), k1",
    "rollout_corr/rollout_is_mean": "importance weight, mean",
    "rollout_corr/rollout_is_ratio_fraction_high": "share of weights truncated",
    "rollout_corr/rollout_rs_masked_fraction": "share of tokens rejected",
    "fully_async/stale_tokens/masked_ratio": "share of tokens masked as stale",
    "filter_groups/filtered_ratio": "share of groups filtered",
}
"""The per-step figures of the off-policy options (those a run logged), with their legend."""


def offpolicy_series(rows: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    return {
        label: [(r["step"], r[key]) for r in rows if key in r]
        for key, label in OFFPOLICY_SERIES.items()
        if any(key in r for r in rows)
    }


def offpolicy_facts(rows: list[dict[str, Any]], summary: dict[str, Any]) -> list[tuple[str, Any]]:
    """The report's lines on the off-policy options, for those the run had on."""

    def mean(key: str) -> float | None:
        values = [r[key] for r in rows if key in r]
        return sum(values) / len(values) if values else None

    facts: list[tuple[str, Any]] = []
    kl, k3 = mean("rollout_corr/kl"), mean("rollout_corr/k3_kl")
    if kl is not None and k3 is not None:
        facts.append(("rollout vs trainer log-probs: KL k1 / k3, mean", f"{kl:.4f} / {k3:.4f}"))
    w = mean("rollout_corr/rollout_is_mean")
    if w is not None:
        top = max(
            r["rollout_corr/rollout_is_max"] for r in rows if "rollout_corr/rollout_is_max" in r
        )
        high = mean("rollout_corr/rollout_is_ratio_fraction_high") or 0.0
        facts.append(
            ("importance weight: mean / max / share truncated", f"{w:.3f} / {top:.3g} / {high:.1%}")
        )
    for key, what in (
        ("rollout_corr/rollout_rs_masked_fraction", "tokens rejected (rollout_rs), mean share"),
        ("fully_async/stale_tokens/masked_ratio", "tokens masked as stale, mean share"),
    ):
        value = mean(key)
        if value is not None:
            facts.append((what, f"{value:.1%}"))
    filtered = [
        r["filter_groups/filtered_groups"] for r in rows if "filter_groups/filtered_groups" in r
    ]
    if filtered:
        total = summary.get("filtered", int(sum(filtered)))
        facts.append(
            (
                "groups filtered (dynamic sampling)",
                f"{total} ({mean('filter_groups/filtered_ratio'):.0%} of those read)",
            )
        )
    return facts


def _rest(w: dict[str, float]) -> float:
    """SyncRequested -> resumed, less the pause and transfer (the three are back to back)."""
    return max(w["resumed_s"] - w["pause_s"] - w["transfer_s"], 0.0)


def _rate_label(launches: int) -> str:
    """What the run's samples/s is over. One launch: the trainer's own figure (the progress
    line's), from when the first worker got its weights, so not samples trained over the
    wall time beside it, which it was taken for; several: the joined launches' wall time."""
    if launches > 1:
        return "samples/s (over the wall time, start-ups included)"
    return "samples/s (from the first worker's weights on)"


def _trained(row: dict[str, Any]) -> float:
    """Samples trained so far (in the row's launch), as the row says. ``perf/samples_per_s``
    is over the time since the first worker joined, shorter than ``perf/elapsed_s``: their
    product, all a run logged before ``perf/samples_trained``, overcounts early steps."""
    if "perf/samples_trained" in row:
        return float(row["perf/samples_trained"])
    return float(row.get("perf/samples_per_s", 0.0)) * float(row.get("perf/elapsed_s", 0.0))


def _step_rates(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Samples/s between consecutive steps: samples trained over the time between them."""
    points = []
    prev_t, prev_n = 0.0, 0.0
    for r in rows:
        t = r["perf/elapsed_s"]
        n = _trained(r)
        if t > prev_t:
            points.append((t, (n - prev_n) / (t - prev_t)))
        prev_t, prev_n = t, n
    return points


def _markdown(
    run_id: str,
    rows: list[dict[str, Any]],
    summary: dict[str, Any],
    counts: dict[int, int],
    windows: list[dict[str, float]],
    plots: dict[str, Path],
    out: Path,
) -> str:
    last = rows[-1]
    trained = sum(counts.values())
    stale = sum(n for k, n in counts.items() if k > 0)
    launches = last.get("launch", 1)
    facts = [
        ("steps", last["step"]),
        # the trainer's clock starts again at each start: a restart within a launch (the
        # trainer killed, `asyncrl run` restarting it) counts as one, as a new launch does
        *([("trainer starts (restarts and resumed launches)", launches)] if launches > 1 else []),
        ("weight version", last["version"]),
        ("finished because", summary.get("reason", "(not finished: still running, or stopped)")),
        ("held-out accuracy, start -> end", _acc(summary, rows)),
        ("wall time", f"{last['perf/elapsed_s']:.1f} s"),
        (_rate_label(launches), f"{last['perf/samples_per_s']:.2f}"),
        ("samples trained", trained or "-"),
        ("of them stale", f"{stale} ({stale / trained:.0%})" if trained else "-"),
        ("dropped", counts_text(summary["dropped"]) if "dropped" in summary else "-"),
        *offpolicy_facts(rows, summary),
    ]
    if windows:
        mean = {k: sum(w[k] for w in windows) / len(windows) for k in windows[0]}
        facts += [
            # The trainer's count (summary.json) when the run has one: a last sync whose
            # workers had not all resumed when the run ended has no window row.
            # (a resumed run's summary counts its last launch's alone)
            ("syncs", summary.get("syncs", len(windows)) if launches == 1 else len(windows)),
            ("sync pause / transfer, mean (trainer)", _ms(mean, "pause_s", "transfer_s")),
            ("weights receive + load, mean (slowest worker)", _ms(mean, "load_s")),
            ("SyncRequested -> resumed, mean", f"{mean['resumed_s'] * 1e3:.0f} ms"),
            # (a window after a trainer restart has no step at the version before it: NaN)
            ("trainer idle ratio, mean of windows", _measured(windows, "trainer_idle")),
            ("rollouter idle ratio, mean of windows", _measured(windows, "rollouter_idle")),
            ("of it out of budget, mean of windows", _measured(windows, "rollouter_budget_idle")),
            # measured from a worker's first budget on: the first window may have none
            ("engine occupancy, mean of windows", _measured(windows, "engine_occupancy")),
            ("engine left empty out of budget, mean", _measured(windows, "budget_unfilled")),
        ]
    lines = [f"# Run `{run_id}`", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in facts]
    for title, png in plots.items():
        lines += ["", f"## {title}", "", f"![{title}]({png.relative_to(out)})"]
    return "\n".join(lines) + "\n"


def _acc(summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    evals = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
    start = summary.get("val/accuracy_initial")
    if start is None:  # no summary (a run still going, or killed): its first step row has it
        start = next((r["val/accuracy_initial"] for r in rows if "val/accuracy_initial" in r), None)
    end = summary.get("val/accuracy", evals[-1] if evals else None)
    if start is None and end is None:
        return "not evaluated"
    return f"{'-' if start is None else f'{start:.3f}'} -> {'-' if end is None else f'{end:.3f}'}"


def _measured(windows: list[dict[str, float]], key: str) -> str:
    """The mean of ``key`` over the windows that measured it; '-' where none did."""
    values = [w[key] for w in windows if w[key] == w[key]]  # NaN: not measured
    return f"{sum(values) / len(values):.2f}" if values else "-"


def _ms(mean: dict[str, float], *keys: str) -> str:
    return " / ".join(f"{mean[k] * 1e3:.0f}" for k in keys) + " ms"
