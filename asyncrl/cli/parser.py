"""The ``asyncrl`` parser: the top level, and each command's from its group's module."""

from __future__ import annotations

import argparse

from asyncrl.cli import bench, exports, replay, roles, run_log

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
    for add in (  # in --help's order
        roles.add_run,
        roles.add_prepare,
        roles.add_train,
        roles.add_rollout,
        roles.add_broker,
        run_log.add_inspect,
        run_log.add_audit,
        replay.add_replay,
        run_log.add_monitor,
        exports.add_report,
        bench.add_bench,
        exports.add_export_model,
        exports.add_export_data,
    ):
        add(sub)
    # A flag is taken only as spelled: argparse would read `--stal 1` as --staleness, and a
    # shortened flag in a script or a doc breaks once a new flag shares its start.
    # add_parser does not pass allow_abbrev on to a subcommand's parser.
    for command in sub.choices.values():
        command.allow_abbrev = False
    return parser
