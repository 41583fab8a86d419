"""The command line: ``asyncrl run|train|rollout|broker|inspect|audit|replay|monitor|report|bench``.

This package parses and dispatches: ``parser.py`` builds the parser from each command group's
module (roles, run_log, replay, exports, bench), and ``main`` calls the command's handler and
turns the errors a user can fix into one line and an exit code. Handlers import torch and
transformers only after the arguments are parsed, so ``asyncrl --help`` answers at once.
Every command takes ``--config FILE`` (default: the embedded demo) and dotted overrides such as
``async_training.staleness_threshold=0.3``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from asyncrl.cli import bench, exports, replay, roles, run_log
from asyncrl.cli.parser import EPILOG, build_parser
from asyncrl.consumers.exit_codes import ExitCode

__all__ = ["COMMANDS", "EPILOG", "build_parser", "main"]

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": roles.cmd_run,
    "prepare": roles.cmd_prepare,
    "train": roles.cmd_train,
    "rollout": roles.cmd_rollout,
    "broker": roles.cmd_broker,
    "inspect": run_log.cmd_inspect,
    "audit": run_log.cmd_audit,
    "replay": replay.cmd_replay,
    "monitor": run_log.cmd_monitor,
    "report": exports.cmd_report,
    "bench": bench.cmd_bench,
    "export-data": exports.cmd_export_data,
    "export-model": exports.cmd_export_model,
}
"""Each command's handler: parsed arguments in, exit code out."""


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()  # imports the config models: the first ~0.5 s of a command
    except KeyboardInterrupt:  # a Ctrl-C during those imports: one line, no traceback
        words = sys.argv[1:] if argv is None else argv
        return _stopped(next((w for w in words if not w.startswith("-")), None), started=False)
    # Overrides may also follow options (`replay topic samples --to-run x key=value`): argparse
    # leaves such trailing positionals unparsed, so they are collected here.
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=f"%(asctime)s {args.command} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:  # first: the next clause imports what the Ctrl-C may have cut
        return _stopped(args.command, started=args.command != "run")  # run's own stop says more
    except _expected_errors() as err:  # evaluated only once something was raised
        if os.environ.get("ASYNCRL_DEBUG", "") not in ("", "0"):
            raise
        print(f"asyncrl {args.command}: {err}", file=sys.stderr)
        if isinstance(err, _usage_errors()):
            return ExitCode.USAGE
        return ExitCode(getattr(err, "EXIT_CODE", ExitCode.FAILED))  # GAVE_UP: no crash
    except BrokenPipeError:  # `asyncrl inspect ... --json | head`: the reader has had enough
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit would fail again
        return ExitCode.BROKEN_PIPE


def _stopped(command: str | None, started: bool) -> int:
    """A Ctrl-C the command did not take itself: one line, the shell's exit code for it."""
    name = f"asyncrl {command}" if command else "asyncrl"
    print(f"{name}: stopped" + ("" if started else " before it started anything"), file=sys.stderr)
    return ExitCode.INTERRUPTED


def _usage_errors() -> tuple[type[Exception], ...]:
    """What the user's config or environment got wrong (exit 2)."""
    from asyncrl.config import ConfigError
    from asyncrl.kafka import MissingSecret

    return ConfigError, MissingSecret


def _expected_errors() -> tuple[type[Exception], ...]:
    """Errors whose message says all (file and line, config key, a process's log tail): shown
    as one message, not a traceback. Imported lazily, so ``--help`` stays instant."""
    from asyncrl.consumers.checkpoint import CheckpointWriteError, TrainerAlreadyRunning
    from asyncrl.consumers.dynamic_sampling import GenBatchesExhausted
    from asyncrl.kafka import BrokerUnavailable, KafkaDeliveryError, MessageTooLarge, UnknownTopic
    from asyncrl.launch.broker import BrokerError
    from asyncrl.launch.launcher import RunFailed

    return (
        *_usage_errors(),
        BrokerUnavailable,
        KafkaDeliveryError,
        MessageTooLarge,
        UnknownTopic,
        BrokerError,
        RunFailed,
        TrainerAlreadyRunning,
        CheckpointWriteError,
        GenBatchesExhausted,
    )
