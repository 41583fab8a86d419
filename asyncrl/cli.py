"""The command line: ``asyncrl run|train|rollout|broker|inspect|audit|replay|monitor|report|bench``.

Entry points stay short and import torch and transformers only after the arguments are
parsed, so ``asyncrl --help`` answers at once. Every command takes ``--config FILE`` (default:
the embedded demo) and dotted overrides such as ``async_training.staleness_threshold=0.3``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from asyncrl.commands import (
    cmd_audit,
    cmd_bench,
    cmd_broker,
    cmd_export_data,
    cmd_export_model,
    cmd_inspect,
    cmd_monitor,
    cmd_prepare,
    cmd_replay,
    cmd_report,
    cmd_rollout,
    cmd_run,
    cmd_train,
)

EPILOG = """\
examples:
  asyncrl run                                   the embedded demo: broker, trainer, 1 worker
  asyncrl run async_training.staleness_threshold=0 actor_rollout_ref.rollout.num_workers=2
  asyncrl run --launcher ray                    trainer and workers as Ray actors
  asyncrl broker --port 9092                    a Kafka-protocol broker for your own runs
  asyncrl prepare kafka.bootstrap_servers=kafka:9092 sync.master_addr=trainer sync.master_port=29500
  asyncrl train --config runs/demo/config.yaml  one role, against kafka.bootstrap_servers
  asyncrl inspect control run_id=demo kafka.bootstrap_servers=127.0.0.1:9092
  asyncrl audit demo                            check a run's log: exits 1 on a violation
  asyncrl replay step 12 --config runs/demo/config.yaml   re-run step 12 from the log
  asyncrl monitor demo                          live per-version health of a running run
  asyncrl report demo                           plots and a summary of runs/demo (report/)
  asyncrl export-data --out data/arithmetic     the task as verl-format parquet (data.train_files)
  asyncrl export-model demo --out my-model      the trained policy as a Hugging Face checkpoint
  asyncrl bench modes                           colocated sync vs modes (a)-(d), seed-shaped sim (~3 min)
  asyncrl bench sync-pause                      sync pause and its hops: (c), (d), (d) in flight
  asyncrl bench learn                           time to 90%: colocated sync vs (c), (d), (d) in flight
  asyncrl bench learn --config calculator       the same with the agent loop and its tool calls
  asyncrl bench learn --seeds 3                 the same, medians over three trainer seeds
  asyncrl bench tuning async_training.in_flight_update=true   staleness x sync cadence grid
  asyncrl bench offpolicy                       high staleness: decoupled PPO, dynamic sampling
  asyncrl bench transport                       Arrow over Kafka vs raw bytes vs a Ray queue
  asyncrl bench sync                            weight transfer: bucketed, per-tensor, file, memcpy
  asyncrl bench tracing                         samples/s with tracing off vs on
  asyncrl bench tools --config calculator       a calculator call: sandbox server vs fresh interpreter
  asyncrl bench engine --shapes demo --new-tokens 128   tokens/s: hf vs hf_cached vs hf_static

A bad config, an unreachable broker or a failed run ends in a one-line error (exit 1 or 2;
`asyncrl train` exits 3 when its trainer gives up at a limit of the config, 4 when it cannot
write a checkpoint: docs/faults.md); set ASYNCRL_DEBUG=1 for the Python traceback.
"""


def _offset(text: str) -> int:
    """An offset on the command line: a whole number, 0 or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"an offset is 0 or more, not {value}")
    return value


class _HelpKeys(argparse.Action):
    """``--help-keys [PREFIX]``: the full key list, which --help leaves out, then exit."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        from asyncrl.ops.config_docs import config_help

        try:
            text = config_help(prefix=str(values or ""))
        except ValueError as err:
            parser.error(str(err))
        sys.stdout.write(text)
        parser.exit()


def _config_args(p: argparse.ArgumentParser, reads_run: bool = False) -> None:
    """--config and overrides; the subcommand's --help ends with the common config keys and
    --help-keys lists every one (from the config models' docstrings, as
    docs/configuration.md). ``reads_run``: a command that reads a finished or running run,
    whose saved config is the default."""
    from asyncrl.config import DEFAULT_CONFIG
    from asyncrl.ops.config_docs import config_help

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (p.epilog + "\n\n" if p.epilog else "") + config_help()
    p.add_argument(
        "--help-keys",
        nargs="?",
        const="",
        metavar="PREFIX",
        action=_HelpKeys,
        help="list every config key (or those under PREFIX, e.g. kafka) and exit",
    )
    default = (
        "the run's saved OUTPUT_DIR/RUN_ID/config.yaml, which names its broker; else the demo's"
        if reads_run
        else "the embedded demo config"
    )
    shipped = ", ".join(
        sorted(f.stem for f in DEFAULT_CONFIG.parent.glob("*.yaml") if f != DEFAULT_CONFIG)
    )
    p.add_argument(
        "--config",
        help=f"run config YAML, or a shipped one by name: {shipped} (default: {default})",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key.path=value",
        help="dotted overrides, e.g. trainer.total_training_steps=50",
    )


def _output_dir_arg(
    p: argparse.ArgumentParser, default: str = "the config's output_dir, runs"
) -> None:
    """A command that finds its run by run_id (the same as output_dir=DIR); ``default``: where
    it looks without one, as its --help says it."""
    p.add_argument("--output-dir", help=f"where run directories live (default: {default})")


def engine_args(p: argparse.ArgumentParser) -> None:
    """``bench engine``'s sizes; unset, each shape's smoke default (bench/engine.py)."""
    p.add_argument(
        "--shapes",
        help="engine and sync: comma-separated model shapes, random weights: engine among demo "
        "(the config's policy), 5M, 50M, 500M (Qwen2.5-0.5B's), default demo,500M; sync among "
        "5M, 50M, 500M, default 50M,500M",
    )
    p.add_argument(
        "--batch",
        type=int,
        help="engine only: requests generated at once (default: the demo's rollout.n x "
        "max_concurrent_samples, 2-8 for the other shapes)",
    )
    p.add_argument("--prompt-len", type=int, help="engine only: the longest prompt, in tokens")
    p.add_argument("--new-tokens", type=int, help="engine only: tokens generated per request")
    p.add_argument(
        "--device",
        help="engine and sync: cpu, cuda, cuda:N (default: auto, a GPU when there is one)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="engine only: after the timed runs, one more generation of hf_cached and "
        "hf_static under torch's profiler; prints their costliest ops (GPU time on a GPU)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="engine only: the model's dtype (default: bfloat16 on a GPU, float32 on a CPU)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncrl",
        description="Fully asynchronous RL post-training for LLMs over a Kafka event log.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "run", help="a whole run: broker (embedded if none), trainer, rollout workers"
    )
    p.add_argument(
        "--launcher",
        choices=["local", "ray"],
        help="local processes (default), or Ray actors on the cluster at ray.address / "
        "RAY_ADDRESS (a local Ray if neither); same as launcher=ray",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved config (asyncrl's names), the verl aliases applied, the keys "
        "ignored and every start-up check, then exit (0: the run could start) starting nothing",
    )
    _config_args(p)

    p = sub.add_parser(
        "prepare",
        help="set a run up on a Kafka cluster (topics, policy, prompts, resolved config), no more",
        description="What `asyncrl run` does before it starts processes: create the run's topics, "
        "build and warm-start the policy into its cache, feed the prompts, and write the "
        "resolved config to output_dir/run_id/config.yaml, which `asyncrl train` and "
        "`asyncrl rollout --worker-id N` then read (--config). Needs kafka.bootstrap_servers; "
        "set sync.master_addr/sync.master_port to where the trainer will listen.",
    )
    _config_args(p)

    p = sub.add_parser(
        "train",
        help="the trainer process alone (needs kafka.bootstrap_servers and sync.master_port; "
        "the config.yaml prepare writes has both)",
    )
    _config_args(p)

    p = sub.add_parser(
        "rollout",
        help="one rollout worker process (needs kafka.bootstrap_servers and the trainer's "
        "sync.master_port)",
    )
    p.add_argument(
        "--worker-id",
        type=int,
        default=0,
        help="this worker's id, one process each (default 0): 0..num_workers-1 start with the "
        "run; another id joins a running one, with a budget from its next sync (docs/cluster.md)",
    )
    _config_args(p)

    p = sub.add_parser("broker", help="start an embedded Kafka-protocol broker (Tansu) and wait")
    p.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--create-topics", action="store_true", help="also create the run's topics")
    _config_args(p)

    p = sub.add_parser(
        "inspect",
        help="read a run's topics back: samples, partials, control, steps, dead-letter",
        description="Reads the run's topic and prints one row per record (the run: run_id=RUN "
        "or a first word RUN; its saved config OUTPUT_DIR/RUN/config.yaml names its broker, "
        "unless --config or kafka.bootstrap_servers is given; an `asyncrl run` with its embedded "
        "broker, finished or running, is read from its archived log): samples with versions, reward, lengths and staleness "
        "at consumption; partial samples with each trajectory's segments; the control history "
        "(every sync's pause/transfer/load times); steps; dead-letter records with their errors.",
    )
    p.add_argument("topic", choices=["samples", "partials", "control", "steps", "dead-letter"])
    p.add_argument("--from", dest="start", type=_offset, default=0, help="first offset (default 0)")
    p.add_argument("--to", dest="end", type=_offset, default=None, help="stop before this offset")
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
    _output_dir_arg(p)
    _config_args(p, reads_run=True)

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
    _output_dir_arg(p)
    _config_args(p, reads_run=True)

    p = sub.add_parser(
        "replay",
        help="re-run a training step from the log and its checkpoint, or re-publish a run's "
        "records into another run",
        description="replay topic samples|partials --to-run OTHER: re-publishes a selection "
        "(offsets, --versions, --sample-ids) into another run's topic, to feed its trainer the "
        "recorded stream. replay step N: loads the checkpoint step N started from, fetches exactly "
        "the samples of step N from the samples topic, re-runs the update and compares loss, "
        "grad norm and the resulting weights with what was recorded. Overrides (e.g. "
        "actor_rollout_ref.actor.optim.lr=1e-3) re-run the step with other settings (one the "
        "recorded samples fix, as actor_rollout_ref.rollout.n, is named in a warning). The run: "
        "run_id=RUN or a word RUN after the target, or --config runs/<run_id>/config.yaml; its "
        "saved config names its broker, and a finished `asyncrl run` is read from its archived "
        "log (OUTPUT_DIR/RUN/log) unless kafka.bootstrap_servers is given.",
    )
    p.add_argument("what", choices=["step", "topic"], help="what to replay")
    p.add_argument("target", help="step: the step number (1-based); topic: samples or partials")
    p.add_argument("--to-run", help="topic: the run_id whose topic receives the records")
    p.add_argument(
        "--to-bootstrap",
        metavar="HOST:PORT",
        help="topic: the broker of the --to-run run (default: the source run's; needed when "
        "the source is read from its archive, as an `asyncrl run` with its embedded broker is)",
    )
    p.add_argument("--from", dest="start", type=_offset, default=0, help="topic: first offset")
    p.add_argument("--to", dest="end", type=_offset, default=None, help="topic: stop before offset")
    p.add_argument(
        "--since",
        help="topic: records at or after this time (ISO 8601, HH:MM:SS in UTC, or epoch ms)",
    )
    p.add_argument("--until", help="topic: records before this time")
    p.add_argument("--versions", help="topic: param_version range, e.g. 3..7")
    p.add_argument(
        "--sample-ids",
        help="topic: comma-separated sample ids (those not on the topic are named; none: exit 1)",
    )
    _output_dir_arg(p)
    _config_args(p, reads_run=True)

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
    _output_dir_arg(p)
    p.add_argument(
        "--engine",
        choices=["auto", "faust", "kafka"],
        default="auto",
        help="faust: a faust-streaming agent (pip install 'asyncrl[monitor]'); kafka: a plain "
        "confluent-kafka reader (no consumer group, starts faster); auto (default): faust "
        "when installed",
    )
    _config_args(p, reads_run=True)

    p = sub.add_parser(
        "report",
        help="PNG plots and a Markdown summary of a run (from its run directory)",
        description="Reads RUN's metrics.jsonl and summary and writes RUN/report/: reward and "
        "held-out accuracy against step and wall time, the staleness histogram, idle ratios "
        "per sync window, each sync's pause/transfer/load, samples/s, and report.md with the "
        "plots inlined. Needs no broker: works on a finished run or a copy of its directory.",
    )
    p.add_argument("run", help="a run directory, or a run_id under --output-dir")
    _output_dir_arg(p, "runs; report reads no config, so only this or output_dir=DIR names another")
    p.add_argument("--out", help="write the report here instead of RUN/report")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="output_dir=DIR",
        help="where run_ids live, as audit, inspect and replay take it (same as --output-dir)",
    )

    p = sub.add_parser(
        "bench",
        help="measurements printed side by side from one invocation",
        description="modes: verl's mode table on the sim engine (--workload seed, the seed's "
        "128-GPU figures time-scaled, or long-tail): colocated sync vs (a) on-policy pipeline, (b) "
        "stream off-policy, (c) stale samples, (d) partial rollout, and a staleness ablation; "
        "time, idle ratios, speedup next to the seed's, efficiency. "
        "sync-pause: the sim engine's long-tail workload in mode (c), mode (d, partial "
        "rollout) and mode (d) with in-flight weight updates; prints how long syncs waited for "
        "the workers to pause, the throughput of each, and where a sync's time goes, hop by hop "
        "(from the control events on the log). "
        "learn: wall time to the target held-out accuracy, colocated sync (with one torch thread "
        "and with every core: the faster is the baseline) vs async (c) vs (d) "
        "vs (d) with in-flight weight updates, and the accuracy curves on one plot (PNG). "
        "offpolicy: the same high-staleness run (staleness 2, trigger 4, partial rollout) "
        "without correction, with decoupled PPO (proximal log-probs, token importance weights), "
        "with dynamic sampling (filter_groups) and with both: accuracy curves, staleness, "
        "mismatch KL, weights and filtered groups side by side. "
        "transport: samples/s, MB/s, encode/decode time and bytes per token of our Arrow samples "
        "through Kafka, next to raw byte strings and a Ray actor queue of pickled tensors. "
        "sync: weight transfer time and GB/s between two processes (shared-memory slots, the "
        "trainer's weights read in place, bucketed, per-tensor, a safetensors file) next to an "
        "in-memory copy of the same bytes; with --device cuda, the CUDA IPC handoffs and gloo "
        "next to a device-to-device copy; and "
        "the time of each checksum format (sha256, on-device) over the same weights. "
        "tracing: samples/s of the sim workload with OpenTelemetry tracing off, then on. "
        "tools: latency of a calculator call, one at a time and a step's burst, with the "
        "sandbox server forking a child per call vs a fresh interpreter per call. "
        "engine: tokens/s of the hf engine (no KV cache), hf_cached and hf_static (slotted "
        "cache, CUDA graphs on a GPU) on the same requests, at the demo model's shape and "
        "Qwen2 shapes (random weights), each one's ratio over hf, and each one's largest "
        "logprob difference from the trainer's recomputation. "
        "tuning: time to the target accuracy over a grid of staleness_threshold x "
        "trigger_parameter_sync_step (the config's async setup), next to colocated sync.",
    )
    p.add_argument(
        "name",
        choices=[
            "modes",
            "sync-pause",
            "learn",
            "offpolicy",
            "transport",
            "sync",
            "tracing",
            "tools",
            "engine",
            "tuning",
        ],
        help="which benchmark",
    )
    p.add_argument(
        "--seeds",
        type=int,
        help="learn and tuning: run every setup with this many trainer.seed values (from the "
        "config's, one more each) and compare medians (default 1)",
    )
    p.add_argument(
        "--staleness",
        default=None,
        help="comma-separated async_training.staleness_threshold values; tuning: the grid's "
        "(default 0.5,1,2); modes: the mode (d) ablation's (default 0.1,0.3, the seed's)",
    )
    p.add_argument(
        "--trigger",
        help="tuning only: comma-separated async_training.trigger_parameter_sync_step values "
        "(default 1,2,4)",
    )
    p.add_argument(
        "--workload",
        choices=["seed", "long-tail"],
        help="modes only: the sim workload; seed (default): the seed's 128-GPU Qwen2.5-7B "
        "figures, time-scaled; long-tail: round numbers (bench/workloads.py)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        help="modes --workload seed: seconds here per second of the seed (default 0.01)",
    )
    engine_args(p)
    _config_args(p)

    p = sub.add_parser(
        "export-model",
        help="a run's trained policy (a checkpoint step) as a Hugging Face checkpoint directory",
        description="Writes the weights of RUN's checkpoint of --step (default: its latest) "
        "into the run's model (actor_rollout_ref.model.path, or the built-in tiny model) and "
        "saves it to OUT with save_pretrained, its tokenizer and chat template beside it: "
        "what transformers, vLLM or actor_rollout_ref.model.path load. The trainer's own "
        "checkpoints (checkpoints/step_N/model.pt) are torch state dicts for resuming.",
    )
    p.add_argument("run", help="a run_id under --output-dir, or a run directory")
    p.add_argument("--out", required=True, help="a new (or empty) directory to write")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the latest)")
    _output_dir_arg(p)
    _config_args(p, reads_run=True)

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
    _config_args(p)
    # A flag is taken only as spelled: argparse would read `--stal 1` as --staleness, and a
    # shortened flag in a script or a doc breaks once a new flag shares its start.
    # add_parser does not pass allow_abbrev on to a subcommand's parser.
    for command in sub.choices.values():
        command.allow_abbrev = False
    return parser


COMMANDS = {
    "run": cmd_run,
    "prepare": cmd_prepare,
    "train": cmd_train,
    "rollout": cmd_rollout,
    "broker": cmd_broker,
    "inspect": cmd_inspect,
    "audit": cmd_audit,
    "replay": cmd_replay,
    "monitor": cmd_monitor,
    "report": cmd_report,
    "bench": cmd_bench,
    "export-data": cmd_export_data,
    "export-model": cmd_export_model,
}


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()  # imports the config models: the first ~0.5 s of a command
    except KeyboardInterrupt:  # Ctrl-C then printed a page of import traceback
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
            return 2
        return int(getattr(err, "EXIT_CODE", 1))  # 3, 4: a trainer that gave up, not crashed
    except BrokenPipeError:  # `asyncrl inspect ... --json | head`: the reader has had enough
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit would fail again
        return 141  # 128 + SIGPIPE, as a shell reports it


def _stopped(command: str | None, started: bool) -> int:
    """A Ctrl-C the command did not take itself: one line, the shell's exit code 130."""
    name = f"asyncrl {command}" if command else "asyncrl"
    print(f"{name}: stopped" + ("" if started else " before it started anything"), file=sys.stderr)
    return 130


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


if __name__ == "__main__":
    raise SystemExit(main())
