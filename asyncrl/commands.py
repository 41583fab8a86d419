"""What each ``asyncrl`` subcommand does, given its parsed arguments (``cli.py`` parses them).

Each imports what it needs inside, so torch and transformers load only for the commands
that use them."""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def _load(args: argparse.Namespace):
    from asyncrl.config import load_config

    return load_config(args.config, args.overrides)


def _load_run(args: argparse.Namespace):
    """The config of a command that reads a run (inspect, replay): --config, else the run's
    own saved config (OUTPUT_DIR/RUN_ID/config.yaml, which names its broker), else the
    demo's; the overrides on top. A first word without ``=`` is the run_id
    (``asyncrl inspect steps myrun``), as audit and monitor take it."""
    from pathlib import Path

    from asyncrl.config import load_config

    if getattr(args, "output_dir", None):  # --output-dir: as audit, monitor and report take it
        args.overrides = [*args.overrides, f"output_dir={args.output_dir}"]
    if args.overrides and "=" not in args.overrides[0]:
        first, rest = args.overrides[0], args.overrides[1:]
        args.overrides = rest
        dirs = [Path(first)] if len(Path(first).parts) > 1 else []
        dirs.append(Path(load_config(None, rest).output_dir) / first)  # runs/<id>.<time> too
        for run_dir in dirs:
            if (run_dir / "config.yaml").exists():
                return _at(load_config(_config_file(args, run_dir), rest), run_dir)
        args.overrides = [f"run_id={first}", *rest]
    cfg = _load(args)  # where the run is: its run_id and output_dir
    saved_in = _run_dir_of_config(args, cfg)
    if saved_in is not None:
        return _at(cfg, saved_in)
    config = _config_file(args, cfg.run_dir)
    return cfg if config == args.config else load_config(config, args.overrides)


def _run_dir_of_config(args: argparse.Namespace, cfg):
    """The run directory ``--config`` was saved in (RUN_DIR/config.yaml beside its log or
    checkpoints) where its own output_dir, relative as the default ``runs`` is, names another
    from this directory; else None. Read from elsewhere, ``replay step --config
    runs/<run_id>/config.yaml`` otherwise looked for the run under this directory and said
    nothing listened at the finished run's broker."""
    from pathlib import Path

    if not args.config or _overrides_key(args, "output_dir"):
        return None
    here = Path(args.config).resolve().parent
    named = here.name == cfg.run_id or here.name.startswith(f"{cfg.run_id}.")
    if Path(args.config).name != "config.yaml" or not named or here == cfg.run_dir.resolve():
        return None
    return here if (here / "log").is_dir() or (here / "checkpoints").is_dir() else None


def _at(cfg, run_dir):
    """``cfg`` read from ``run_dir`` (its output_dir the parent; a directory not named by its
    run_id, such as a run moved aside as runs/<id>.<time>, keeps its run_id's topics)."""
    run_dir = run_dir.resolve()
    _rebase_relative_paths(cfg, run_dir)
    cfg.output_dir = str(run_dir.parent)
    return cfg if run_dir.name == cfg.run_id else cfg.at_dir(run_dir)


def _rebase_relative_paths(cfg, run_dir) -> None:
    """A run saved before config/paths.py made its paths absolute keeps the relative paths it
    was started with (model.path=models/m, the data files, the reward file), which loading
    took from this directory: read from another one, ``replay``/``export-model`` failed on
    them. Where one names nothing here but something in the directory the run was started
    from (found from the run's directory and its relative output_dir), it names that."""
    from pathlib import Path

    import yaml

    from asyncrl.config.paths import absolute, section_of

    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
        out = saved.get("output_dir")
    except (OSError, yaml.YAMLError, AttributeError):
        return
    depth = len(Path(str(out or "runs")).parts)
    if Path(str(out or "runs")).expanduser().is_absolute() or depth >= len(run_dir.parents):
        return  # started from anywhere (or saved with absolute paths): nothing to find it by
    launched_in = run_dir.parents[depth]

    def rebased(path: str, written: Any) -> str:
        if not isinstance(written, str) or Path(path).exists():
            return path
        there = absolute(written, launched_in)
        return there if Path(there).exists() else path

    def written(key: str) -> Any:
        value: Any = saved
        for name in key.split("."):
            value = value.get(name) if isinstance(value, dict) else None
        return value

    for key in (
        "actor_rollout_ref.model.path",
        "data.train_files",
        "data.val_files",
        "custom_reward_function.path",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    ):
        section, leaf = section_of(cfg, key)
        value, raw = getattr(section, leaf), written(key)
        if isinstance(value, str):
            setattr(section, leaf, rebased(value, raw))
        elif isinstance(value, list) and isinstance(raw, list) and len(raw) == len(value):
            setattr(section, leaf, [rebased(v, r) for v, r in zip(value, raw, strict=True)])


def _config_file(args: argparse.Namespace, run_dir):
    """--config, else the run's saved config.yaml when it has one (it names the run's
    broker), else None (the demo's)."""
    saved = run_dir / "config.yaml"
    return args.config or (saved if saved.exists() else None)


@contextlib.contextmanager
def _log_broker(
    cfg, args: argparse.Namespace, role: str, topics: Collection[str] | None = None
) -> Iterator[str]:
    """The broker holding the run's log: the run's archived log (``asyncrl run`` with the
    embedded broker keeps it in runs/<run_id>/log) served by a throwaway broker, unless
    kafka.bootstrap_servers is given on this command line; else the configured broker.
    ``topics``: the run topics the command reads, the only ones the throwaway one gets."""
    from asyncrl.launch.log_archive import has_archive, offline_broker

    named = _named_bootstrap(args)
    if has_archive(cfg) and not named:
        from asyncrl.launch.log_archive import log_dir

        logging.getLogger("asyncrl").info("reading the run's archived log, %s", log_dir(cfg))
        with contextlib.ExitStack() as stack:
            with reading_shown(role):
                bootstrap = stack.enter_context(offline_broker(cfg, topics))
            yield bootstrap
    else:
        yield _reading_bootstrap(cfg, role, named)


def reading_shown(role: str, console: Console | None = None) -> contextlib.AbstractContextManager:
    """A transient line on stderr while ``role`` reads a run's log ("audit: demo.prompts:
    1,204,000 records"), on a terminal only: a long run's log is millions of records, and
    its restore and reading took minutes with nothing on the screen."""
    from rich.console import Console

    from asyncrl.launch.progress import records_shown

    return records_shown(console or Console(stderr=True), f"{role}: reading the run's log", role)


def _named_bootstrap(args: argparse.Namespace) -> bool:
    return _overrides_key(args, "kafka.bootstrap_servers")


def _overrides_key(args: argparse.Namespace, key: str) -> bool:
    """Whether the command line sets ``key`` (``key=value``, or Hydra's forms of it)."""
    from asyncrl.config.overrides import override_key

    return any(override_key(o) == key for o in args.overrides)


def _reading_bootstrap(cfg, role: str, named: bool = False) -> str:
    """The configured broker of a command that reads a run (inspect, audit, monitor, replay),
    checked first where a wrong guess is cheap to tell: a run_id that names no run here, or
    a loopback address nothing listens on (a finished run's embedded broker, whose port its
    saved config still names), fail at once instead of after the broker-down timeout."""
    if not cfg.kafka.bootstrap_servers:
        if not cfg.run_dir.exists():
            raise SystemExit(f"asyncrl {role}: {_no_such_run(cfg)}")
        if not (cfg.run_dir / "config.yaml").exists():  # written once its set-up is done
            raise SystemExit(f"asyncrl {role}: {_no_saved_config(cfg)}")
        return _need_bootstrap(cfg, role)
    closed = _closed_loopback(cfg.kafka.bootstrap_servers)
    if closed is None:
        return cfg.kafka.bootstrap_servers
    from asyncrl.launch.log_archive import has_archive, log_dir, run_ref

    if has_archive(cfg) and not named:
        ref = run_ref(cfg)
        raise SystemExit(
            f"asyncrl {role}: run {cfg.run_id!r} has ended: nothing listens at its broker's "
            f"{closed} any more. Its log is archived in {log_dir(cfg)}: `asyncrl inspect "
            f"samples {ref}`, `asyncrl audit {ref}` and `asyncrl report {ref}` read it "
            "without a broker"
        )
    raise SystemExit(
        f"asyncrl {role}: nothing listens at {closed} (kafka.bootstrap_servers): start the "
        "broker, or pass the address of the one holding the run"
    )


def _no_saved_config(cfg) -> str:
    """Why a run directory with no config.yaml names no broker. A trainer started by hand
    without `asyncrl prepare` (the README's trainer of a replayed stream) writes none: its
    finished run was said to have "never got past its start-up", pointing at a logs/
    directory it does not have."""
    run_dir = cfg.run_dir
    if any((run_dir / name).exists() for name in ("checkpoints", "metrics.jsonl")):
        return (
            f"{run_dir} holds no config.yaml to name the broker of run {cfg.run_id!r} (its "
            "trainer was started without `asyncrl prepare`): pass kafka.bootstrap_servers="
            "HOST:PORT"
        )
    logs = f" (see {run_dir / 'logs'})" if (run_dir / "logs").is_dir() else ""
    return (
        f"run {cfg.run_id!r} never got past its start-up: {run_dir} holds no config.yaml "
        f"and no log{logs}"
    )


def _output_dir(args: argparse.Namespace):
    """Where a command that reads a run finds RUN (a run_id): --output-dir, else output_dir=
    among the overrides (or --config's), as inspect takes it, ``~`` expanded and made absolute
    as the config makes it: `asyncrl monitor RUN output_dir=/x` looked in runs/ ("no run RUN
    in runs/"), and report, with a parser of its own, took ``output_dir=~/runs`` as written.
    ``--output-dir=~/runs`` too (the shell expands no ``~`` after ``=``)."""
    from pathlib import Path

    from asyncrl.config import load_config

    given = args.output_dir or load_config(getattr(args, "config", None), args.overrides).output_dir
    return Path(given).expanduser()


def _run_config(args: argparse.Namespace):
    """The config of RUN (``args.run``: a run_id under --output-dir, or a run directory): its
    resolved config.yaml when it has one, else --config; the command line's overrides on top.
    The saved config names the run's broker, so a live run is found without its address."""
    from pathlib import Path

    from asyncrl.config import load_config

    output_dir = _output_dir(args)
    run = args.run
    given = Path(run)
    if len(given.parts) > 1:  # a path (runs/demo, /abs/run), not a run_id
        output_dir, run = given.resolve().parent, given.resolve().name
    config = _config_file(args, output_dir / run)
    if config is not None and not args.config:  # the run's own: its run_id names its topics
        return _at(load_config(config, args.overrides), output_dir / run)
    cfg = load_config(config, [*args.overrides, f"run_id={run}"])
    cfg.output_dir = str(output_dir)
    return cfg


SET_ASIDE = re.compile(r"\.\d{8}-\d{6}$")
"""A finished run's directory moved aside by the next run of its run_id (launcher)."""


def _no_such_run(cfg, on_a_cluster: bool = True) -> str:
    """No run ``cfg.run_id`` under its output_dir, naming those there; ``on_a_cluster``: adds
    how to read one on a Kafka cluster (not for what reads the run's directory alone)."""
    from pathlib import Path

    out = Path(cfg.output_dir)
    here = sorted(
        p.name
        for p in out.glob("*/")
        if (p / "config.yaml").exists() and not SET_ASIDE.search(p.name)  # runs/<id>.<time>
    )
    listed = f" (runs there: {', '.join(here[:12])}{', ...' if len(here) > 12 else ''})"
    hint = "; for a run on a Kafka cluster, pass kafka.bootstrap_servers=HOST:PORT"
    return f"no run {cfg.run_id!r} in {out}/{listed if here else ''}{hint if on_a_cluster else ''}"


def _closed_loopback(bootstrap: str) -> str | None:
    """``bootstrap`` when every address in it is on loopback and refuses a connection; None
    otherwise (one answers, or a remote broker may be slow, not gone)."""
    from asyncrl.kafka.health import accepts_connection

    addresses = [a.strip().rpartition(":") for a in bootstrap.split(",") if a.strip()]
    if not addresses or any(h not in ("127.0.0.1", "localhost", "::1") for h, _, _ in addresses):
        return None
    for host, _, port in addresses:
        if not port.isdigit() or accepts_connection(host, int(port), 1.0):
            return None
    return ",".join(f"{h}:{p}" for h, _, p in addresses)


def table_console() -> Console:
    """A console for wide tables: the terminal's width, or wide off a terminal."""
    from asyncrl.launch.progress import wide_console

    return wide_console()


def _check_startable(cfg, role: str) -> None:
    """Start-up checks (launch/preflight.py): a bad value fails here, naming its key."""
    from asyncrl.launch.preflight import check_startable

    check_startable(cfg, role)


def _need_bootstrap(cfg, role: str) -> str:
    if not cfg.kafka.bootstrap_servers:
        raise SystemExit(
            f"asyncrl {role}: kafka.bootstrap_servers is not set. Start a broker "
            "(`asyncrl broker`) and pass kafka.bootstrap_servers=HOST:PORT, or use `asyncrl run`."
        )
    return cfg.kafka.bootstrap_servers


def _need_master_port(cfg, role: str) -> None:
    """A role started alone needs the weight collective's port: ``asyncrl run`` picks one,
    ``asyncrl prepare`` writes it into the run's config.yaml. Given neither (the README's
    ``asyncrl train run_id=OTHER kafka.bootstrap_servers=...``), the trainer loaded the
    policy, then died in a traceback from the weight sync."""
    if cfg.sync.master_port is None:
        raise SystemExit(
            f"asyncrl {role}: sync.master_port is not set: the trainer listens on it and the "
            "workers join through it. Pass sync.master_port=PORT (e.g. 29500), or "
            "--config runs/<run_id>/config.yaml as `asyncrl prepare` wrote it"
        )


def cmd_run(args: argparse.Namespace) -> int:
    from asyncrl.launch.launcher import Terminated, run, stop_on_signals

    if args.launcher:
        args.overrides = [*args.overrides, f"launcher={args.launcher}"]
    if args.dry_run:
        from asyncrl.launch.preflight import dry_run

        return dry_run(args.config, args.overrides)
    cfg = _load(args)
    stop_on_signals()
    try:
        summary = run(cfg)
    except KeyboardInterrupt as stopped:  # the run stopped in order; the same command resumes
        return 143 if isinstance(stopped, Terminated) else 130  # the shell's codes for both
    return 0 if summary else 1


def cmd_prepare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from asyncrl.config import ConfigError
    from asyncrl.launch.resume import decide
    from asyncrl.launch.resume_check import refuse_changed_keys
    from asyncrl.launch.setup import prepare

    cfg = _load(args)
    bootstrap = _need_bootstrap(cfg, "prepare")
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
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import json

    from asyncrl.launch.resume_check import refuse_changed_keys

    cfg = _load(args)
    _check_startable(cfg, "train")
    refuse_changed_keys(cfg)  # a key its run cannot change, as `asyncrl run` refuses it
    bootstrap = _need_bootstrap(cfg, "train")
    if _said_finished(cfg, bootstrap, "train", "nothing to train"):
        return 0
    _need_master_port(cfg, "train")
    _torch_threads(cfg.trainer.torch_threads)
    import signal

    from asyncrl.consumers.trainer import Trainer, TrainerStopped

    backend = None
    if cfg.actor_rollout_ref.rollout.name == "sim":  # benchmarks: the update's time modelled
        from asyncrl.bench.sim_update import SimulatedUpdate

        backend = SimulatedUpdate(cfg)
    trainer = Trainer(cfg, bootstrap, backend=backend)
    # SIGTERM (docker compose stop, kill) and a first Ctrl-C: stop between two steps with a
    # checkpoint of the last one; a second Ctrl-C stops at once.
    signal.signal(signal.SIGTERM, lambda *_: trainer.stop("SIGTERM"))

    def interrupted(*_: object) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        trainer.stop("Ctrl-C")

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # kept so: `asyncrl run &`
        signal.signal(signal.SIGINT, interrupted)
    try:
        summary = trainer.run()
    except TrainerStopped as stopped:
        logging.getLogger("asyncrl.train").warning("%s", stopped)
        return 130 if trainer.stopping == "Ctrl-C" else 143  # the shell's codes for both
    finally:
        trainer.close()
    tmp = cfg.run_dir / "summary.json.tmp"  # whole or absent: a relaunch reads it (resume)
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(cfg.run_dir / "summary.json")
    logging.getLogger("asyncrl.train").info(
        "done at step %s, version %s (%s); summary in %s",
        *(summary.get("step"), summary.get("version"), summary.get("reason")),
        cfg.run_dir / "summary.json",
    )
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    from asyncrl.launch.resume_check import refuse_changed_keys

    cfg = _load(args)
    _check_startable(cfg, "rollout")
    refuse_changed_keys(cfg)  # a key its run cannot change, as `asyncrl run` refuses it
    bootstrap = _need_bootstrap(cfg, "rollout")
    if _said_finished(cfg, bootstrap, "rollout", "nothing to generate"):
        return 0
    _need_master_port(cfg, "rollout")
    _torch_threads(cfg.actor_rollout_ref.rollout.torch_threads)
    import signal

    from asyncrl.producers.worker import RolloutWorker

    worker = RolloutWorker(cfg, args.worker_id, bootstrap)
    stopped_by: list[str] = []

    def stop(how: str) -> None:
        stopped_by.append(how)
        worker.stop()

    # SIGTERM (docker stop, Ray, kill): leave cleanly; unfinished prompts go back to the group.
    signal.signal(signal.SIGTERM, lambda *_: stop("SIGTERM"))

    def interrupted(*_: object) -> None:
        """Ctrl-C: leave as SIGTERM does (WorkerStopped said 'error'); a second one at once."""
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stop("Ctrl-C")

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # kept so: `asyncrl run &`
        signal.signal(signal.SIGINT, interrupted)
    produced = worker.run()
    if worker.displaced:
        print(f"asyncrl rollout: worker {args.worker_id}: {worker.displaced}", file=sys.stderr)
        return 1
    if stopped_by and not worker.follower.finished:
        # Not 0, which says the run finished: `asyncrl run` restarted no worker that exited
        # 0, and a run whose only worker was stopped waited for samples until it failed.
        logging.getLogger("asyncrl.rollout").warning(
            "worker %d stopped (%s) with the run still open; its unfinished prompts went back "
            "to the group",
            args.worker_id,
            stopped_by[0],
        )
        return 130 if stopped_by[0] == "Ctrl-C" else 143  # the shell's codes for both
    before = worker.produced_before
    logging.getLogger("asyncrl.rollout").info(
        "worker %d produced %d samples%s",
        *(args.worker_id, produced - before),
        f" ({produced} under its id, with the {before} of earlier processes)" if before else "",
    )
    return 0


def _said_finished(cfg, bootstrap: str, role: str, nothing: str) -> bool:
    """Whether the run's log ends with its RunFinished, said on stderr. A trainer started on
    a finished run (`asyncrl train` again, a second `docker compose up`) resumed from its last
    checkpoint, trained the samples left on the log, published TrainerResumed (so the run no
    longer counted as finished) and waited for workers that, seeing it, waited too."""
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
    A worker started on a finished run (a second `docker compose up` of one RUN_ID) joined a
    trainer long gone, waited sync.timeout_s deaf to SIGTERM, then died with a traceback. A
    run never prepared has no control topic: UnknownTopic, naming it."""
    from asyncrl.ops.audit import finishing_event, read_control

    return finishing_event(read_control(cfg, bootstrap))


def cmd_broker(args: argparse.Namespace) -> int:
    import signal
    import threading

    from asyncrl.launch.broker import EmbeddedBroker

    cfg = _load(args)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedBroker(port=args.port) as broker:
        print(f"broker ready: kafka.bootstrap_servers={broker.bootstrap}", flush=True)
        if args.create_topics:
            from asyncrl.kafka.topics import create_run_topics

            cfg.kafka.bootstrap_servers = broker.bootstrap
            print("topics:", ", ".join(create_run_topics(cfg, broker.bootstrap)), flush=True)
        print("Ctrl-C to stop (in-memory storage: topics vanish with the broker)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    return 0


def _time_range(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """``--since``/``--until`` as epoch ms; ValueError names a bad value."""
    from asyncrl.ops.inspect_log import parse_time

    return (
        parse_time(args.since) if args.since else None,
        parse_time(args.until) if args.until else None,
    )


def cmd_inspect(args: argparse.Namespace) -> int:
    from asyncrl.ops.inspect_log import READS, print_rows, topic_rows

    cfg = _load_run(args)
    try:
        since, until = _time_range(args)
    except ValueError as err:
        print(f"asyncrl inspect: {err}", file=sys.stderr)
        return 2
    with (
        _log_broker(cfg, args, "inspect", READS[args.topic]) as bootstrap,
        reading_shown("inspect"),
    ):
        rows = topic_rows(
            cfg, bootstrap, args.topic, args.start, args.end, args.json, args.text, since, until
        )
    ranged = bool(args.start or args.end or since or until)
    print_rows(cfg, args.topic, rows, table_console(), args.json, ranged)
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    import json

    from asyncrl.launch.log_archive import ArchiveError
    from asyncrl.ops.audit import AuditError, audit_run, print_report

    cfg = _run_config(args)
    try:
        with _log_broker(cfg, args, "audit") as bootstrap, reading_shown("audit"):
            report = audit_run(cfg, bootstrap)
    except (AuditError, ArchiveError) as err:
        print(f"asyncrl audit: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print_report(report, table_console())
    return 0 if report.ok else 1


def cmd_replay(args: argparse.Namespace) -> int:
    from rich.console import Console

    from asyncrl.ops.replay import STEP_READS, ReplayError, replay_step, replay_topic

    cfg = _load_run(args)
    try:
        if args.what == "step":
            step = _replay_step_number(args.target)
            _replayable_overrides(args.overrides)
            idle = _no_effect_on_replay(args.overrides)
            if idle:
                print(
                    f"asyncrl replay: warning: {', '.join(idle)}: no effect on a replayed step "
                    "(its samples, rewards and the model it started from are the run's); the "
                    "update's settings are actor_rollout_ref.actor.*, algorithm.*",
                    file=sys.stderr,
                )
            with _log_broker(cfg, args, "replay", STEP_READS) as bootstrap:
                replay_step(cfg, bootstrap, step, Console())
        else:
            if args.target not in ("samples", "partials"):
                raise ReplayError(f"replay topic takes samples or partials, not {args.target!r}")
            if not args.to_run:
                raise ReplayError("replay topic needs --to-run RUN_ID")
            versions = _version_range(args.versions) if args.versions else None
            closed = args.to_bootstrap and _closed_loopback(args.to_bootstrap)
            if closed:  # the broker-down timeout later, naming kafka.bootstrap_servers
                raise ReplayError(
                    f"nothing listens at {closed} (--to-bootstrap): start run {args.to_run}'s "
                    "broker (`asyncrl broker --port PORT`), or name the one it runs on"
                )
            ids = None if args.sample_ids is None else _sample_ids(args.sample_ids)
            try:
                since, until = _time_range(args)
            except ValueError as err:
                raise ReplayError(str(err)) from None
            # From the run's log (its archive, or its broker); into the target run's broker:
            # --to-bootstrap, else the source's, which must then be up
            with _log_broker(cfg, args, "replay topic") as bootstrap:
                target = args.to_bootstrap
                if target is None and bootstrap != cfg.kafka.bootstrap_servers:
                    raise ReplayError(
                        f"{cfg.run_id} is read from its archive ({bootstrap}, a broker that "
                        "ends with this command): name the broker of run "
                        f"{args.to_run} with --to-bootstrap HOST:PORT"
                    )
                replay_topic(
                    cfg, bootstrap, args.target, args.to_run, Console(), args.start, args.end,
                    versions, ids, since, until, target,
                )  # fmt: skip
    except ReplayError as err:
        print(f"asyncrl replay: {err}", file=sys.stderr)
        return 1
    return 0


def _replay_step_number(text: str) -> int:
    """``replay step N``'s N, checked before the run's log is opened (a throwaway broker for
    an archive): ``replay step abc`` ended in int()'s ValueError traceback."""
    from asyncrl.ops.replay import ReplayError

    if not text.isdigit() or int(text) < 1:
        raise ReplayError(f"replay step takes a step number (1, 2, ...), not {text!r}")
    return int(text)


MODEL_SHAPE = re.compile(
    r"actor_rollout_ref\.model\.(hidden_size|num_hidden_layers|num_attention_heads|"
    r"intermediate_size|warmup_\w+)$"
)
"""The built-in policy's shape and warm start: a step's checkpoint holds the model it ran on."""


def _replayable_overrides(overrides: list[str]) -> None:
    """``replay step N key=value`` re-runs the update with other settings; one that builds
    another model (``actor_rollout_ref.model.hidden_size=64``) warm-started that model for
    ~45 s, then died in a 44-line traceback loading the checkpoint into it."""
    from asyncrl.config.overrides import override_key
    from asyncrl.ops.replay import ReplayError

    for override in overrides:
        key = override_key(override)
        if MODEL_SHAPE.match(key):
            raise ReplayError(
                f"{key}: replay step runs the step on the model its checkpoint holds, so the "
                "model's shape and warm start are the run's; override the update instead "
                "(actor_rollout_ref.actor.*, algorithm.*)"
            )


NO_EFFECT_ON_REPLAY = re.compile(
    r"(actor_rollout_ref\.rollout\.(?!temperature$)|data\.(?!max_response_length$)|"
    r"custom_reward_function\.|algorithm\.(filter_groups|overlong_buffer)\.|"
    r"async_training\.(staleness_threshold|trigger_parameter_sync_step|require_batches|"
    r"partial_rollout|use_trainer_do_validate|in_flight_update|max_version_lag)$|"
    r"kafka\.topics\.partitions\.)"
)
"""Keys the recorded samples fix (generation, data, scoring, batching, the topics they are on):
a replay re-runs the update on them. rollout.temperature (the log-probs' temperature) and
data.max_response_length (the loss's default scale) do change it. Not derived from the keys a
resumed run may not change (``launch/resume_check.FIXED``): most of these may change on a
resume (they shape the samples to come), and some fixed ones change a replay
(actor.ppo_mini_batch_size); a test holds each fixed key to a warning, a refusal or a reason."""


def _no_effect_on_replay(overrides: list[str]) -> list[str]:
    """The overrides of ``replay step N`` that cannot change it:
    ``replay step 5 actor_rollout_ref.rollout.n=4`` was taken and silently did nothing."""
    from asyncrl.config.overrides import override_key
    from asyncrl.config.verl_keys import VERL_KEYS

    idle = []
    for key in map(override_key, overrides):
        rule = VERL_KEYS.get(key)  # verl's rollout.response_length is data.max_response_length
        if NO_EFFECT_ON_REPLAY.match(rule.target if rule and rule.target else key):
            idle.append(key)
    return idle


def _version_range(text: str) -> tuple[int, int]:
    """``--versions 3..7`` (or ``3``) as an inclusive range; ``3-7`` ended in a traceback."""
    from asyncrl.ops.replay import ReplayError

    lo, _, hi = text.partition("..")
    if not lo.isdigit() or not (hi or lo).isdigit() or int(lo) > int(hi or lo):
        raise ReplayError(
            f"--versions takes a range LOW..HIGH such as 3..7, or one version, not {text!r}"
        )
    return int(lo), int(hi or lo)


def _sample_ids(text: str) -> set[str]:
    """``--sample-ids a,b``'s ids, each stripped: ``"a, b"`` asked for the id " b", which no
    sample has. One naming no id (``""`` from an empty shell variable replayed the whole
    topic) is an error."""
    from asyncrl.ops.replay import ReplayError

    ids = {sid.strip() for sid in text.split(",")} - {""}
    if not ids:
        raise ReplayError(
            f"--sample-ids names no sample id ({text!r}): give them comma-separated, as a,b"
        )
    return ids


def cmd_bench(args: argparse.Namespace) -> int:
    from asyncrl.bench.learn import learn
    from asyncrl.bench.modes import modes
    from asyncrl.bench.offpolicy import offpolicy
    from asyncrl.bench.sync import sync
    from asyncrl.bench.sync_pause import sync_pause
    from asyncrl.bench.tools import tools
    from asyncrl.bench.tracing import tracing_cost
    from asyncrl.bench.transport import transport

    benchmarks = {
        "sync-pause": sync_pause,
        "learn": learn,
        "offpolicy": offpolicy,
        "transport": transport,
        "tracing": tracing_cost,
        "tools": tools,
    }
    lists = _bench_option_problem(args) or _bench_lists(args)
    if isinstance(lists, str):
        print(f"asyncrl bench {args.name}: {lists}", file=sys.stderr)
        return 2
    staleness = lists.get("staleness")
    seeds = 1 if args.seeds is None else args.seeds
    if args.name == "modes":
        modes(
            args.config,
            args.overrides,
            table_console(),
            workload=args.workload or "seed",
            time_scale=0.01 if args.time_scale is None else args.time_scale,
            staleness=staleness,
        )
        return 0
    if args.name == "engine":
        from asyncrl.bench.engine import engine

        engine(
            args.config,
            args.overrides,
            table_console(),
            shapes=tuple((args.shapes or "demo,500M").split(",")),
            batch=args.batch,
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            device=args.device or "auto",
            dtype=args.dtype,
            profile=args.profile,
        )
        return 0
    if args.name == "learn":
        learn(args.config, args.overrides, table_console(), seeds=seeds)
        return 0
    if args.name == "tuning":
        from asyncrl.bench.tuning import STALENESS, TRIGGER, tuning

        grid = staleness or STALENESS
        trigger = lists.get("trigger") or TRIGGER
        tuning(args.config, args.overrides, table_console(), seeds, grid, trigger)
        return 0
    if args.name == "sync":
        from asyncrl.bench.sync import DEFAULT_SHAPES

        shapes = tuple(args.shapes.split(",")) if args.shapes else DEFAULT_SHAPES
        sync(args.config, args.overrides, table_console(), shapes, device=args.device or "auto")
        return 0
    benchmarks[args.name](args.config, args.overrides, table_console())
    return 0


BENCH_OPTIONS: dict[str, tuple[str, ...]] = {
    "seeds": ("learn", "tuning"),
    "staleness": ("modes", "tuning"),
    "trigger": ("tuning",),
    "workload": ("modes",),
    "time_scale": ("modes",),
    "shapes": ("engine", "sync"),
    "batch": ("engine",),
    "prompt_len": ("engine",),
    "new_tokens": ("engine",),
    "device": ("engine", "sync"),
    "profile": ("engine",),
    "dtype": ("engine",),
}
"""Each ``asyncrl bench`` option and the benchmarks that read it: given to another, it would be
ignored without a word (``bench learn --trigger 2`` ran learn's own setups), so it is refused."""


BENCH_LISTS: dict[str, tuple[type, float, str, str]] = {
    "staleness": (float, 0, "numbers", "0.5,1,2"),
    "trigger": (int, 1, "whole numbers", "1,2,4"),
}
"""The comma-separated ``asyncrl bench`` options: dest -> (type, least value, what, example)."""


def _bench_lists(args: argparse.Namespace) -> dict[str, tuple[Any, ...]] | str:
    """The comma-separated options given, parsed (dest -> values; the one parse the benchmarks
    get), or what is wrong with one, in one line naming the flag and the value."""
    out: dict[str, tuple[Any, ...]] = {}
    for dest, (kind, low, what, example) in BENCH_LISTS.items():
        text = getattr(args, dest)
        if text is None:
            continue
        flag, values = f"--{dest}", []
        for part in text.split(","):
            try:
                value = kind(part)
            except ValueError:
                value = None
            if value is None or not low <= value < float("inf"):
                return (
                    f"{flag} takes comma-separated {what} of at least {low:g} "
                    f"(e.g. {example}), not {part.strip()!r}"
                )
            values.append(value)
        out[dest] = tuple(values)
    return out


def _bench_option_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``asyncrl bench``'s options, in one line, or None: an option the
    benchmark does not read, or a value no run could take (the comma-separated ones:
    :func:`_bench_lists`). Checked before any run starts, so a slip does not surface after
    the baseline ran for minutes."""
    for dest, benches in BENCH_OPTIONS.items():
        given = getattr(args, dest)
        if given is not None and given is not False and args.name not in benches:
            flag = "--" + dest.replace("_", "-")
            return f"{flag} applies to {' and '.join(benches)}, not {args.name}"
    if args.time_scale is not None and args.workload == "long-tail":
        return "--time-scale applies to --workload seed (long-tail is in seconds already)"
    for flag, value in (
        ("--seeds", args.seeds),
        ("--batch", args.batch),
        ("--prompt-len", args.prompt_len),
        ("--new-tokens", args.new_tokens),
    ):
        if value is not None and value < 1:
            return f"{flag} must be at least 1 (got {value})"
    if args.time_scale is not None and not 0 < args.time_scale < float("inf"):
        return f"--time-scale must be above 0 (got {args.time_scale:g})"
    return _device_problem(args.device) if args.device is not None else None


def _device_problem(device: str) -> str | None:
    """``--device`` that torch would refuse deep in the benchmark, with a traceback: a name it
    does not know, or CUDA where torch sees none (or fewer devices than the index)."""
    match = re.fullmatch(r"auto|cpu|cuda(?::(\d+))?", device)
    if match is None:
        return f"--device takes auto, cpu, cuda or cuda:N, not {device!r}"
    if device.startswith("cuda"):
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(match.group(1) or 0) >= count:
            return f"--device {device}: torch sees {count} CUDA device(s) here"
    return None


def cmd_monitor(args: argparse.Namespace) -> int:
    from asyncrl.ops.monitor import monitor

    cfg = _run_config(args)
    bootstrap = _reading_bootstrap(cfg, "monitor", _named_bootstrap(args))
    with contextlib.suppress(KeyboardInterrupt):
        monitor(cfg, bootstrap, table_console(), follow=not args.once, engine=args.engine)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from asyncrl.ops.report import ReportError, resolve_run_dir, write_report

    try:
        run_dir = resolve_run_dir(args.run, _report_output_dir(args))
        path = write_report(run_dir, Path(args.out) if args.out else None)
    except ReportError as err:
        print(f"asyncrl report: {err}", file=sys.stderr)
        return 1
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    Console().print(f"report: {path} ({len(pngs)} plots: {', '.join(pngs)})")
    return 0


def _report_output_dir(args: argparse.Namespace) -> str:
    """Where report finds RUN (``_output_dir``, as audit, inspect and replay find it; ``report
    RUN output_dir=DIR`` was a usage error). Report reads the run's directory, not its config,
    so any other key is refused, naming it: it could not change what report writes."""
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
        return str(_output_dir(args))
    except ConfigError as err:  # one line, as report's other errors (exit 1)
        raise ReportError(str(err)) from None


def cmd_export_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asyncrl.ops.export_model import ExportError, export_model

    cfg = _run_config(args)
    if not cfg.run_dir.exists():  # said "no checkpoint in runs/nope/checkpoints (kept: none)"
        print(f"asyncrl export-model: {_no_such_run(cfg, on_a_cluster=False)}", file=sys.stderr)
        return 1
    try:
        path = export_model(cfg, Path(args.out), args.step)
    except ExportError as err:
        print(f"asyncrl export-model: {err}", file=sys.stderr)
        return 1
    print(f"{args.out}: {path.name} of run {cfg.run_id} as a Hugging Face checkpoint")
    return 0


def cmd_export_data(args: argparse.Namespace) -> int:
    from pathlib import Path

    import pyarrow.parquet as pq

    from asyncrl.tasks.files import export_task

    cfg = _load(args)
    for name, path in export_task(cfg.data, Path(args.out)).items():
        rows = pq.read_metadata(path).num_rows
        print(f"{name}: {path} ({rows} rows of data.task={cfg.data.task})")
    return 0


def _torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
