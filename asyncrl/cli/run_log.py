"""``asyncrl inspect | audit | monitor``: a run's log read back, checked, or followed live."""

from __future__ import annotations

import argparse
import contextlib
import sys

from asyncrl.cli.args import Subcommands, config_args, offset, output_dir_arg
from asyncrl.cli.find_run import (
    load_run,
    log_broker,
    named_bootstrap,
    reading_bootstrap,
    reading_shown,
    run_config,
    table_console,
)
from asyncrl.consumers.exit_codes import ExitCode


def add_inspect(sub: Subcommands) -> None:
    p = sub.add_parser(
        "inspect",
        help="read a run's topics back: samples, partials, control, steps, dead-letter; or "
        "where its roles ran (placement)",
        description="Reads the run's topic and prints one row per record (the run: run_id=RUN "
        "or a first word RUN; its saved config OUTPUT_DIR/RUN/config.yaml names its broker, "
        "unless --config or kafka.bootstrap_servers is given; an `asyncrl run` with its embedded "
        "broker, finished or running, is read from its archived log): samples with versions, reward, lengths and staleness "
        "at consumption; partial samples with each trajectory's segments; the control history "
        "(every sync's pause/transfer/load times); steps; dead-letter records with their errors. "
        "placement: where each role ran (a launcher=ray run's node, IP, host and bundle at each "
        "process start, from the run's directory, no broker).",
    )
    p.add_argument(
        "topic", choices=["samples", "partials", "control", "steps", "dead-letter", "placement"]
    )
    p.add_argument("--from", dest="start", type=offset, default=0, help="first offset (default 0)")
    p.add_argument("--to", dest="end", type=offset, default=None, help="stop before this offset")
    p.add_argument(
        "--since",
        help="records at or after this time: ISO 8601 (UTC unless it names a zone), a time of "
        "day as the tables show it (HH:MM:SS, UTC, the latest such moment), or epoch ms",
    )
    p.add_argument("--until", help="records before this time")
    p.add_argument(
        "--json",
        action="store_true",
        help="JSON lines instead of a table (times ISO 8601 with the date)",
    )
    p.add_argument("--text", action="store_true", help="decode token ids to text")
    output_dir_arg(p)
    config_args(p, reads_run=True)


def add_audit(sub: Subcommands) -> None:
    p = sub.add_parser(
        "audit",
        help="check a run's log: every sample trained once, every prompt accounted, syncs, budget",
        description="Reads all of RUN's topics and checks what the "
        "design promises: no duplicate sample or prompt; every sample a step trained on is on "
        "the log and trained once (steps voided by a trainer restart aside); every prompt the "
        "rollout group committed is one sample or one logged drop; each version published with "
        "one checksum, versions only growing; every sync requested was published; no version "
        "started more samples than its budget; every partial sample of a finished run finished "
        "or dropped. Prints the counts (violations in red) and a verdict; exits 1 if a check "
        "fails, 2 if the log cannot be read. Run it first after a crash. The config is RUN's "
        "resolved one (OUTPUT_DIR/RUN/config.yaml) when it exists, else --config; overrides "
        "apply on top. "
        "A run of the embedded broker is read from its archived log (OUTPUT_DIR/RUN/log) "
        "unless kafka.bootstrap_servers is given.",
    )
    p.add_argument("run", help="a run_id under --output-dir, or a run directory")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    output_dir_arg(p)
    config_args(p, reads_run=True)


def add_monitor(sub: Subcommands) -> None:
    p = sub.add_parser(
        "monitor",
        help="a run's health, live, per weight version (reads its topics)",
        description="A separate process reading RUN's samples, steps, control and dead-letter "
        "topics from the beginning (no consumer group, so it disturbs nobody) and showing, per "
        "weight version: samples produced, mean reward, partial ratio, samples consumed, stale "
        "count and staleness spread, held-out accuracy, trainer and rollouter idle ratios (the "
        "latter's share out of budget), engine occupancy (its empty share out of budget); and "
        "run-wide queue lag, drops, dead-lettered records and workers. Stops at RunFinished "
        "(or Ctrl-C). Reads from the run's broker: the one its resolved config names "
        "(OUTPUT_DIR/RUN/config.yaml: a live `asyncrl run`'s embedded broker is found so), "
        "or kafka.bootstrap_servers. A finished run's archived log is read by inspect and "
        "audit (report reads its metrics.jsonl).",
    )
    p.add_argument("run", help="a run_id under --output-dir, or a run directory")
    p.add_argument("--once", action="store_true", help="print what is there now and exit")
    output_dir_arg(p)
    p.add_argument(
        "--engine",
        choices=["auto", "faust", "kafka"],
        default="auto",
        help="faust: a faust-streaming agent (pip install 'asyncrl[monitor]'); kafka: a plain "
        "confluent-kafka reader (no consumer group, starts faster); auto (default): faust "
        "when installed",
    )
    config_args(p, reads_run=True)


def time_range(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """``--since``/``--until`` as epoch ms; ValueError names a bad value."""
    from asyncrl.ops.inspect_log import parse_time

    return (
        parse_time(args.since) if args.since else None,
        parse_time(args.until) if args.until else None,
    )


def cmd_inspect(args: argparse.Namespace) -> int:
    from asyncrl.ops.inspect_log import READS, print_rows, topic_rows

    cfg = load_run(args)
    if args.topic == "placement":  # the run's directory, not its log: no broker
        from asyncrl.ops.inspect_placement import print_placement

        print_placement(cfg.run_dir, table_console(), args.json)
        return ExitCode.OK
    try:
        since, until = time_range(args)
    except ValueError as err:
        print(f"asyncrl inspect: {err}", file=sys.stderr)
        return ExitCode.USAGE
    with (
        log_broker(cfg, args, "inspect", READS[args.topic]) as bootstrap,
        reading_shown("inspect"),
    ):
        rows = topic_rows(
            cfg, bootstrap, args.topic, args.start, args.end, args.json, args.text, since, until
        )
    ranged = bool(args.start or args.end or since or until)
    print_rows(cfg, args.topic, rows, table_console(), args.json, ranged)
    return ExitCode.OK


def cmd_audit(args: argparse.Namespace) -> int:
    import json

    from asyncrl.launch.log_archive import ArchiveError
    from asyncrl.ops.audit import AuditError, audit_run, print_report

    cfg = run_config(args)
    try:
        with log_broker(cfg, args, "audit") as bootstrap, reading_shown("audit"):
            report = audit_run(cfg, bootstrap)
    except (AuditError, ArchiveError) as err:
        print(f"asyncrl audit: {err}", file=sys.stderr)
        return ExitCode.USAGE
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print_report(report, table_console())
    return ExitCode.OK if report.ok else ExitCode.FAILED


def cmd_monitor(args: argparse.Namespace) -> int:
    from asyncrl.ops.monitor import monitor

    cfg = run_config(args)
    bootstrap = reading_bootstrap(cfg, "monitor", named_bootstrap(args))
    with contextlib.suppress(KeyboardInterrupt):
        monitor(cfg, bootstrap, table_console(), follow=not args.once, engine=args.engine)
    return ExitCode.OK
