"""``asyncrl run | prepare | train | rollout | broker``: a whole run, its set-up, one role, a
broker. Each role's process (signals, exit code) is its entry beside it: launch/run_entry.py,
consumers/train_entry.py, producers/rollout_entry.py, launch/broker.py's ``serve``; these
handlers check what a role started by hand needs, then call it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from asyncrl.cli.args import Subcommands, config_args
from asyncrl.cli.find_run import load, need_bootstrap
from asyncrl.consumers.exit_codes import ExitCode


def add_run(sub: Subcommands) -> None:
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
    config_args(p)


def add_prepare(sub: Subcommands) -> None:
    p = sub.add_parser(
        "prepare",
        help="set a run up on a Kafka cluster (topics, policy, prompts, resolved config), no more",
        description="What `asyncrl run` does before it starts processes: create the run's topics, "
        "build and warm-start the policy into its cache, feed the prompts, and write the "
        "resolved config to output_dir/run_id/config.yaml, which `asyncrl train` and "
        "`asyncrl rollout --worker-id N` then read (--config). Needs kafka.bootstrap_servers; "
        "set sync.master_addr/sync.master_port to where the trainer will listen.",
    )
    config_args(p)


def add_train(sub: Subcommands) -> None:
    p = sub.add_parser(
        "train",
        help="the trainer process alone (needs kafka.bootstrap_servers and sync.master_port; "
        "the config.yaml prepare writes has both)",
    )
    config_args(p)


def add_rollout(sub: Subcommands) -> None:
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
    config_args(p)


def add_broker(sub: Subcommands) -> None:
    p = sub.add_parser("broker", help="start an embedded Kafka-protocol broker (Tansu) and wait")
    p.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--create-topics", action="store_true", help="also create the run's topics")
    config_args(p)


def cmd_run(args: argparse.Namespace) -> int:
    if args.launcher:
        args.overrides = [*args.overrides, f"launcher={args.launcher}"]
    if args.dry_run:
        from asyncrl.launch.preflight import dry_run

        return dry_run(args.config, args.overrides)
    from asyncrl.launch.run_entry import run_until_stopped

    return run_until_stopped(load(args))


def cmd_prepare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from asyncrl.config import ConfigError
    from asyncrl.launch.resume import decide
    from asyncrl.launch.resume_check import refuse_changed_keys
    from asyncrl.launch.setup import prepare

    cfg = load(args)
    bootstrap = need_bootstrap(cfg, "prepare")
    if cfg.sync.master_port is None:
        raise SystemExit(
            "asyncrl prepare: sync.master_port is not set: pick the port the trainer will "
            "listen on (e.g. sync.master_port=29500 sync.master_addr=<trainer host>)"
        )
    refuse_changed_keys(cfg)  # a run set up before: its topics and prompts stay
    # what `asyncrl run` refuses on the cluster (resume_mode=disable beside the run's
    # checkpoints): the trainer started next would resume the run
    if (decision := decide(cfg)).outcome == "refused":
        raise ConfigError(f"{decision.key}: {decision.line}")
    prepare(cfg, bootstrap, Console())
    return ExitCode.OK


def cmd_train(args: argparse.Namespace) -> int:
    from asyncrl.consumers.train_entry import train

    cfg = load(args)
    bootstrap = _role_startable(cfg, "train", "nothing to train")
    if bootstrap is None:
        return ExitCode.OK
    backend = None
    if cfg.actor_rollout_ref.rollout.name == "sim":  # benchmarks: the update's time modelled
        from asyncrl.bench.sim_update import SimulatedUpdate

        backend = SimulatedUpdate(cfg)
    return train(cfg, bootstrap, backend=backend)


def cmd_rollout(args: argparse.Namespace) -> int:
    from asyncrl.producers.rollout_entry import rollout

    cfg = load(args)
    bootstrap = _role_startable(cfg, "rollout", "nothing to generate")
    return ExitCode.OK if bootstrap is None else rollout(cfg, args.worker_id, bootstrap)


def cmd_broker(args: argparse.Namespace) -> int:
    from asyncrl.launch.broker import serve

    cfg = load(args)
    serve(args.port, cfg if args.create_topics else None)
    return ExitCode.OK


def _role_startable(cfg, role: str, nothing: str) -> str | None:
    """The broker of a role started by hand once its start-up checks pass, or None when its
    run has finished (said on stderr). A bad value fails here, naming its key, before the
    role loads a model: the start-up checks (launch/preflight.py), a key its run cannot
    change (as `asyncrl run` refuses it), no broker, no weight collective's port."""
    from asyncrl.launch.preflight import check_startable
    from asyncrl.launch.resume_check import refuse_changed_keys

    check_startable(cfg, role)
    refuse_changed_keys(cfg)
    bootstrap = need_bootstrap(cfg, role)
    if _said_finished(cfg, bootstrap, role, nothing):
        return None
    _need_master_port(cfg, role)
    return bootstrap


def _need_master_port(cfg, role: str) -> None:
    """A role started alone needs the weight collective's port: ``asyncrl run`` picks one,
    ``asyncrl prepare`` writes it into the run's config.yaml."""
    if cfg.sync.master_port is None:
        raise SystemExit(
            f"asyncrl {role}: sync.master_port is not set: the trainer listens on it and the "
            "workers join through it. Pass sync.master_port=PORT (e.g. 29500), or "
            "--config runs/<run_id>/config.yaml as `asyncrl prepare` wrote it"
        )


def _said_finished(cfg, bootstrap: str, role: str, nothing: str) -> bool:
    """Whether the run's log ends with its RunFinished, said on stderr. A role started on a
    finished run does not start: a trainer would resume it (publishing TrainerResumed, which
    reopens the run) and a worker would wait for a trainer long gone."""
    finished = _finished_on_log(cfg, bootstrap)
    if finished is None:
        return False
    print(
        f"asyncrl {role}: run {cfg.run_id!r} has finished ({finished.reason or 'RunFinished'}, "
        f"step {finished.step}): {nothing}; a new run needs a run_id of its own",
        file=sys.stderr,
    )
    return True


def _finished_on_log(cfg, bootstrap: str) -> Any:
    """The RunFinished that ends the run's control log (no trainer resumed after it), or None.
    A run never prepared has no control topic: UnknownTopic, naming it."""
    from asyncrl.ops.audit import finishing_event, read_control

    return finishing_event(read_control(cfg, bootstrap))
