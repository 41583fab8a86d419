"""``asyncrl inspect``: read a run's topics back as tables or JSON lines.

The log is the run's memory: which samples were produced under which weight version, how
stale they were when the trainer used them, how a partial trajectory grew across syncs, how
long each sync paused, and what was dead-lettered and why. Records are read raw and decoded
here, so a message that fails to decode is shown with its error instead of stopping the read.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from datetime import time as dt_time
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.config import RunConfig
from asyncrl.kafka import (
    HEADER_ERROR,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
)
from asyncrl.kafka.records import read_records
from asyncrl.schemas import DecodeError
from asyncrl.schemas import control as ev
from asyncrl.schemas.partial import decode_partial
from asyncrl.schemas.sample import TokenIds, decode_sample
from asyncrl.schemas.step import StepRecord, decode_step
from asyncrl.telemetry.metrics import stale_in_step

TOPICS = ("samples", "partials", "control", "steps", "dead-letter")


def parse_time(text: str, now: datetime | None = None) -> int:
    """Epoch milliseconds from ``1700000000000``, an ISO time (``2026-11-22T07:49:57``, UTC
    unless it names a zone), or a time of day as the tables show it (``07:49:57.123``, UTC):
    the latest such moment up to ``now``, today's or else yesterday's."""
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        try:
            of_day = dt_time.fromisoformat(text)
        except ValueError:
            raise ValueError(
                f"not a time: {text!r} (epoch ms, ISO 8601, or HH:MM:SS in UTC)"
            ) from None
        now = now or datetime.now(timezone.utc)
        when = datetime.combine(now.date(), of_day, timezone.utc)
        if when > now:
            when -= timedelta(days=1)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)


def _ts(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def _iso(ms: int) -> str:
    """A record's time with its date, for ``--json`` (a table shows the time of day alone, but
    a script joining rows of a run that crossed midnight, or of two days, needs the date)."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


def _consumed_at(cfg: RunConfig, bootstrap: str) -> dict[str, tuple[int, int]]:
    """sample_id -> (step, trainer version) of the step in force that trained on it (a step
    a trainer restart voided trained on nothing that lasted)."""
    out: dict[str, tuple[int, int]] = {}
    steps, void = _steps_in_force(cfg, bootstrap)
    for (_offset, step), voided in zip(steps, void, strict=True):
        for sid in [] if voided else step.sample_ids:
            out[sid] = (step.step, step.version)
    return out


def _dropped(cfg: RunConfig, bootstrap: str) -> dict[str, str]:
    """sample_id -> the reason of the SamplesDropped naming it (the last, where several do): a
    sample the trainer filtered, found too stale or invalid, so that the samples view shows why
    it was not trained, a reason otherwise on the control topic only."""
    from asyncrl.ops.audit import read_control

    return {
        sid: event.reason
        for event in read_control(cfg, bootstrap)
        if isinstance(event, ev.SamplesDropped)
        for sid in event.sample_ids
    }


def _steps_in_force(cfg: RunConfig, bootstrap: str) -> tuple[list[tuple[int, Any]], list[bool]]:
    """Every step record with its offset, and which of them a trainer restart voided
    (``audit.void_steps``: their updates were lost with the trainer; the steps were redone)."""
    from asyncrl.ops.audit import read_control, void_steps

    steps = []
    for rec in read_records(cfg, bootstrap, "steps"):
        with contextlib.suppress(DecodeError):
            steps.append((rec.offset, decode_step(rec.value, rec.headers)))
    control = read_control(cfg, bootstrap) if steps else []  # restarts matter only to steps
    return steps, void_steps([s for _, s in steps], control)


def _segments(t) -> list[dict[str, int]]:
    """A trajectory's chain of segments: the weight version of each and its token count."""
    return [{"version": v, "tokens": end - start} for start, end, v in t.segments()]


def _sample_row(rec, text: Callable[[TokenIds], str] | None, consumed) -> dict[str, Any]:
    s = decode_sample(rec.value, rec.headers)
    trajs = s.trajectories
    row: dict[str, Any] = {
        "offset": rec.offset,
        "time": _ts(rec.timestamp_ms),
        "sample_id": s.sample_id,
        "worker": s.worker_id,
        "versions": f"{s.param_version}..{s.param_version_end}",
        "max_span": max(t.span for t in trajs),
        "reward_mean": round(sum(t.reward for t in trajs) / len(trajs), 4),
        "length_mean": round(sum(len(t.response_ids) for t in trajs) / len(trajs), 2),
    }
    if row["max_span"] > 0:  # a partial rollout: show how each trajectory grew
        row["segments"] = [_segments(t) for t in trajs]
    if any(t.num_turns > 1 for t in trajs):  # the agent loop: turns and tool calls
        row["turns"] = [t.num_turns for t in trajs]
        row["tool_calls"] = sum(t.tool_calls for t in trajs)
        row["tool_errors"] = sum(t.tool_errors for t in trajs)
    if any(t.turn_scores for t in trajs):  # an interaction scored its replies
        row["turn_scores"] = [t.turn_scores for t in trajs]
    if any(t.reward_failed for t in trajs):  # the reward function raised or timed out
        row["reward_errors"] = [t.reward_error for t in trajs]
    step = consumed.get(s.sample_id)
    row["trained_at_step"] = step[0] if step else None
    row["staleness"] = step[1] - s.param_version if step else None
    if text is not None:
        row["prompt"] = text(s.prompt_ids)
        row["responses"] = [text(t.response_ids) for t in trajs]
    return row


def _partial_row(rec, text: Callable[[TokenIds], str] | None, _consumed) -> dict[str, Any]:
    p = decode_partial(rec.value, rec.headers)
    trajs = p.sample.trajectories
    row: dict[str, Any] = {
        "offset": rec.offset,
        "time": _ts(rec.timestamp_ms),
        "sample_id": p.sample.sample_id,
        "interrupted_at": p.interrupted_at_version,
        "interrupted": len(p.interrupted),
        "finished": len(trajs) - len(p.interrupted),
        "segments": [_segments(t) for t in trajs],
    }
    # One per trajectory, as "segments": the phase an interrupted one was cut in, None for a
    # finished one (it has no agent state), so the list lines up with the trajectories.
    phases = [json.loads(a)["phase"] if a else None for a in p.agent_state]
    if any(phase not in (None, "generating") for phase in phases):  # agents cut elsewhere
        row["agent_phases"] = phases
    if any(t.turn_scores for t in trajs):  # an interaction scored its replies so far
        row["turn_scores"] = [t.turn_scores for t in trajs]
    if text is not None:  # as a sample's row: what was asked, then what was written so far
        row["prompt"] = text(p.sample.prompt_ids)
        row["responses"] = [text(t.response_ids) for t in trajs]
    return row


_EVENT_FIELDS = (
    "pause_s", "pause_wait_s", "transfer_s", "load_s", "n_partial", "in_flight_finished",
    "budget", "num_stale", "count", "reason", "checksum_ok", "step", "accuracy",
    "checkpoint_version", "target_worker", "sample_ids",
)  # fmt: skip
"""What a control row details. A Validated row without its accuracy, a SamplesDropped or
BudgetGranted without the samples or the worker they concern, or a TrainerResumed without
its checkpoint's version left the question the row raised to a script over the raw topic."""


def _control_row(rec, _text, _consumed) -> dict[str, Any]:
    e = ev.decode_event(rec.value, rec.headers)
    row: dict[str, Any] = {
        "offset": rec.offset,
        "time": _ts(rec.timestamp_ms),
        "event": type(e).__name__,
        "version": e.version,
        "worker": getattr(e, "worker", None),
    }
    details = {f: getattr(e, f) for f in _EVENT_FIELDS if getattr(e, f, []) != []}
    if details.get("target_worker") == row["worker"]:  # a worker's own drop: no one else's
        del details["target_worker"]
    row["details"] = ", ".join(f"{k}={_detail(v)}" for k, v in details.items())
    return row


def _detail(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def _step_row(rec, _text, voided) -> dict[str, Any]:
    s = decode_step(rec.value, rec.headers)
    m = s.metrics
    row = {
        "offset": rec.offset,
        "time": _ts(rec.timestamp_ms),
        "step": s.step,
        "version": s.version,
        "samples": len(s.sample_ids),
        "pg_loss": m.get("actor/pg_loss"),
        "reward": m.get("critic/score/mean"),
        "stale": stale_in_step(m),  # this step's; verl's stale_samples_processed is a total
        "accuracy": m.get("val/accuracy"),
    }
    if rec.offset in voided:  # a column only where a restart voided a step
        row["void"] = True
    row.update(_step_details(s))
    return row


def _dead_letter_row(rec, _text, _consumed) -> dict[str, Any]:
    h = rec.headers
    return {
        "offset": rec.offset,
        "time": _ts(rec.timestamp_ms),
        "key": rec.key,
        # topic[partition]@offset, as the readers' logs name it
        "source": f"{h.get(HEADER_SOURCE_TOPIC, b'').decode()}"
        f"[{h.get(HEADER_SOURCE_PARTITION, b'?').decode()}]@"
        f"{h.get(HEADER_SOURCE_OFFSET, b'').decode()}",
        "bytes": len(rec.value or b""),
        "error": h.get(HEADER_ERROR, b"").decode(errors="replace"),
    }


ROWS = {
    "samples": _sample_row,
    "partials": _partial_row,
    "control": _control_row,
    "steps": _step_row,
    "dead-letter": _dead_letter_row,
}


READS: dict[str, tuple[str, ...]] = {
    "samples": ("samples", "steps", "control"),  # the step in force that trained each
    "partials": ("partials",),
    "control": ("control",),
    "steps": ("steps", "control"),  # the restarts that voided steps
    "dead-letter": ("dead-letter",),
}
"""Per topic shown, the run topics its rows are made from: all an archived log's broker
needs restored (never ``prompts``, a long run's largest)."""


def inspect_topic(
    cfg: RunConfig, bootstrap: str, name: str, console: Console, **selection: Any
) -> list[dict[str, Any]]:
    """Print (and return) the rows of :func:`topic_rows` (``selection``: its keywords)."""
    rows = topic_rows(cfg, bootstrap, name, **selection)
    ranged = any(selection.get(k) for k in ("start", "end", "since_ms", "until_ms"))
    print_rows(cfg, name, rows, console, selection.get("as_json", False), ranged)
    return rows


def topic_rows(
    cfg: RunConfig,
    bootstrap: str,
    name: str,
    start: int = 0,
    end: int | None = None,
    as_json: bool = False,
    text: bool = False,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> list[dict[str, Any]]:
    """One row per record of ``name`` in ``[start, end)`` (``as_json``: times with their
    date), read before anything is printed (the CLI shows its progress while it reads)."""
    if name not in ROWS:
        raise ValueError(f"unknown topic {name!r}; choose from {', '.join(TOPICS)}")
    decode_text = None
    if text:
        from asyncrl.models.policy import load_tokenizer

        tok = load_tokenizer(cfg)

        def decode_text(ids: TokenIds) -> str:
            return tok.decode(ids.tolist(), skip_special_tokens=True)

    consumed: Any = {}  # what a row needs from other records
    dropped: dict[str, str] = {}
    if name == "samples":
        consumed = _consumed_at(cfg, bootstrap)
        dropped = _dropped(cfg, bootstrap)
    elif name == "steps":
        steps, void = _steps_in_force(cfg, bootstrap)
        consumed = {offset for (offset, _), voided in zip(steps, void, strict=True) if voided}
    rows = []
    for rec in read_records(cfg, bootstrap, name, start, end, since_ms=since_ms, until_ms=until_ms):
        try:
            row = ROWS[name](rec, decode_text, consumed)
        except DecodeError as err:
            row = {"offset": rec.offset, "time": _ts(rec.timestamp_ms), "decode_error": str(err)}
        if row.get("sample_id") in dropped and row.get("trained_at_step") is None:
            row["dropped"] = dropped[row["sample_id"]]  # why it was never trained
        if as_json:
            row["time"] = _iso(rec.timestamp_ms)
        rows.append(row)
    return rows


JSON_ONLY = ("weights_checksum", "metrics", "samples_trained")
"""The keys of a step's row that ``--json`` prints and a table leaves out (see _step_details)."""


def _step_details(s: StepRecord) -> dict[str, Any]:
    """What a step's JSON row adds to its table row: every metric the trainer logged and the
    samples it trained on, where they are on the log, so that a script needs neither
    metrics.jsonl (not on the log) nor the raw topic."""
    where = zip(s.sample_ids, s.partitions, s.offsets, strict=True)
    return {
        "weights_checksum": s.weights_checksum,
        "metrics": s.metrics,
        "samples_trained": [{"sample_id": i, "partition": p, "offset": o} for i, p, o in where],
    }


def print_rows(
    cfg: RunConfig,
    name: str,
    rows: list[dict[str, Any]],
    console: Console,
    as_json: bool = False,
    ranged: bool = False,
) -> None:
    """``rows`` of topic ``name`` as JSON lines or one table (``ranged``: they are a range's)."""
    if as_json:
        for row in rows:
            console.file.write(json.dumps(row, default=str) + "\n")
        return
    if not rows:  # a table with no columns prints as one blank line
        console.print(f"{cfg.topic(name)}: no records" + (" in that range" if ranged else ""))
        return
    table = Table(title=f"{cfg.topic(name)}: {len(rows)} records")
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns and k not in JSON_ONLY]
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(row.get(c)) for c in columns))
    if "void" in columns:
        table.caption = (
            "void: a trainer restart lost this step's update (it resumed from an earlier "
            "checkpoint) and the step was trained again, on the same samples: a later row"
        )
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | dict):
        # text as it reads (--text's responses): not \u escapes of every non-ASCII character
        return json.dumps(value, ensure_ascii=False)
    return str(value)
