"""``asyncrl report | export-model | export-data``: what a run leaves, written out: plots and a
summary, the trained policy as a Hugging Face checkpoint, the task's prompts as parquet."""

from __future__ import annotations

import argparse
import sys

from asyncrl.cli.args import Subcommands, config_args, output_dir_arg
from asyncrl.cli.find_run import load, no_such_run, output_dir_of, run_config
from asyncrl.consumers.exit_codes import ExitCode


def add_report(sub: Subcommands) -> None:
    p = sub.add_parser(
        "report",
        help="PNG plots and a Markdown summary of a run (from its run directory)",
        description="Reads RUN's metrics.jsonl and summary and writes RUN/report/: reward and "
        "held-out accuracy against step and wall time, the staleness histogram, idle ratios "
        "per sync window, each sync's pause/transfer/load, samples/s, and report.md with the "
        "plots inlined. Needs no broker: works on a finished run or a copy of its directory.",
    )
    p.add_argument("run", help="a run directory, or a run_id under --output-dir")
    output_dir_arg(p, "runs; report reads no config, so only this or output_dir=DIR names another")
    p.add_argument("--out", help="write the report here instead of RUN/report")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="output_dir=DIR",
        help="where run_ids live, as audit, inspect and replay take it (same as --output-dir)",
    )


def add_export_model(sub: Subcommands) -> None:
    p = sub.add_parser(
        "export-model",
        help="a run's trained policy (a checkpoint step) as a Hugging Face checkpoint directory",
        description="Writes the weights of RUN's checkpoint of --step (default: its latest) "
        "into the run's model (actor_rollout_ref.model.path, or the built-in tiny model) and "
        "saves it to OUT with save_pretrained, its tokenizer and chat template beside it: "
        "what transformers, vLLM or actor_rollout_ref.model.path load. The trainer's own "
        "checkpoints (checkpoints/step_N/model.pt, or shards/ of a sharded trainer's ranks, read "
        "whole here) are for resuming.",
    )
    p.add_argument("run", help="a run_id under --output-dir, or a run directory")
    p.add_argument("--out", required=True, help="a new (or empty) directory to write")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the latest)")
    output_dir_arg(p)
    config_args(p, reads_run=True)


def add_export_data(sub: Subcommands) -> None:
    p = sub.add_parser(
        "export-data",
        help="write data.task's prompts as verl-format parquet (train.parquet, val.parquet)",
        description="Writes the train and val prompts of the config's data.task (arithmetic by "
        "default; data.train_size, val_size, seed apply) to OUT/train.parquet and "
        "OUT/val.parquet in verl's dataset format: data_source, prompt (chat messages), ability, "
        "reward_model {style, ground_truth}, extra_info {split, index, prompt_id}. An example "
        "of what data.train_files / data.val_files read.",
    )
    p.add_argument("--out", required=True, help="directory to write the two files into")
    config_args(p)


def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from asyncrl.ops.report import ReportError, resolve_run_dir, write_report

    try:
        run_dir = resolve_run_dir(args.run, _report_output_dir(args))
        path = write_report(run_dir, Path(args.out) if args.out else None)
    except ReportError as err:
        print(f"asyncrl report: {err}", file=sys.stderr)
        return ExitCode.FAILED
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    Console().print(f"report: {path} ({len(pngs)} plots: {', '.join(pngs)})")
    return ExitCode.OK


def _report_output_dir(args: argparse.Namespace) -> str:
    """Where report finds RUN (``output_dir_of``, as audit, inspect and replay find it). Report
    reads the run's directory, not its config, so an override of any other key is refused,
    naming it: it could not change what report writes."""
    from asyncrl.config.base import ConfigError
    from asyncrl.config.overrides import parse_overrides
    from asyncrl.ops.report import ReportError

    try:
        for key, _ in parse_overrides(args.overrides):
            if key != "output_dir":
                raise ReportError(
                    f"{key}: report takes only output_dir=DIR (where RUN lives); it reads the "
                    "run's metrics.jsonl, not a config"
                )
        return str(output_dir_of(args))
    except ConfigError as err:  # one line, as report's other errors (exit 1)
        raise ReportError(str(err)) from None


def cmd_export_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asyncrl.ops.export_model import ExportError, export_model

    cfg = run_config(args)
    if not cfg.run_dir.exists():  # no run, rather than a run without checkpoints
        print(f"asyncrl export-model: {no_such_run(cfg, on_a_cluster=False)}", file=sys.stderr)
        return ExitCode.FAILED
    try:
        path = export_model(cfg, Path(args.out), args.step)
    except ExportError as err:
        print(f"asyncrl export-model: {err}", file=sys.stderr)
        return ExitCode.FAILED
    print(f"{args.out}: {path.name} of run {cfg.run_id} as a Hugging Face checkpoint")
    return ExitCode.OK


def cmd_export_data(args: argparse.Namespace) -> int:
    from pathlib import Path

    import pyarrow.parquet as pq

    from asyncrl.tasks.files import export_task

    cfg = load(args)
    for name, path in export_task(cfg.data, Path(args.out)).items():
        rows = pq.read_metadata(path).num_rows
        print(f"{name}: {path} ({rows} rows of data.task={cfg.data.task})")
    return ExitCode.OK
