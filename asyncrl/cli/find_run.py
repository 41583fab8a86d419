"""Finding the run a command names, its config and the broker holding its log.

A run is named by ``run_id=RUN``, a first word RUN, ``--config OUTPUT_DIR/RUN/config.yaml`` or
a run directory; its saved config names its broker, and a run of the embedded broker is read
from its archived log (OUTPUT_DIR/RUN/log). Each helper imports what it needs inside, so the
parser stays torch-free."""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def load(args: argparse.Namespace):
    """The command's config: --config (default: the demo's) with the overrides on top."""
    from asyncrl.config import load_config

    return load_config(args.config, args.overrides)


def load_run(args: argparse.Namespace):
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
    cfg = load(args)  # where the run is: its run_id and output_dir
    saved_in = _run_dir_of_config(args, cfg)
    if saved_in is not None:
        return _at(cfg, saved_in)
    config = _config_file(args, cfg.run_dir)
    return cfg if config == args.config else load_config(config, args.overrides)


def _run_dir_of_config(args: argparse.Namespace, cfg):
    """The run directory ``--config`` was saved in (RUN_DIR/config.yaml beside its log or
    checkpoints) where its own output_dir, relative as the default ``runs`` is, names another
    from this directory; else None. So ``replay step --config runs/<run_id>/config.yaml``
    finds its run from any directory."""
    from pathlib import Path

    if not args.config or overrides_key(args, "output_dir"):
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
    """The relative paths of a run's saved config (model.path=models/m, the data files, the
    reward file) name files in the directory the run was started from, found from the run's
    directory and its relative output_dir. Where one names nothing from here but something
    there, it is made to name that, so ``replay`` and ``export-model`` read a run from
    anywhere."""
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
def log_broker(
    cfg, args: argparse.Namespace, role: str, topics: Collection[str] | None = None
) -> Iterator[str]:
    """The broker holding the run's log: the run's archived log (``asyncrl run`` with the
    embedded broker keeps it in runs/<run_id>/log) served by a throwaway broker, unless
    kafka.bootstrap_servers is given on this command line; else the configured broker.
    ``topics``: the run topics the command reads, the only ones the throwaway one gets."""
    from asyncrl.launch.log_archive import has_archive, offline_broker

    named = named_bootstrap(args)
    if has_archive(cfg) and not named:
        from asyncrl.launch.log_archive import log_dir

        logging.getLogger("asyncrl").info("reading the run's archived log, %s", log_dir(cfg))
        with contextlib.ExitStack() as stack:
            with reading_shown(role):
                bootstrap = stack.enter_context(offline_broker(cfg, topics))
            yield bootstrap
    else:
        yield reading_bootstrap(cfg, role, named)


def reading_shown(role: str, console: Console | None = None) -> contextlib.AbstractContextManager:
    """A transient line on stderr while ``role`` reads a run's log ("audit: demo.prompts:
    1,204,000 records"), on a terminal only: a long run's log is millions of records, read
    for minutes."""
    from rich.console import Console

    from asyncrl.launch.progress import records_shown

    return records_shown(console or Console(stderr=True), f"{role}: reading the run's log", role)


def named_bootstrap(args: argparse.Namespace) -> bool:
    """Whether the command line names the broker (kafka.bootstrap_servers)."""
    return overrides_key(args, "kafka.bootstrap_servers")


def overrides_key(args: argparse.Namespace, key: str) -> bool:
    """Whether the command line sets ``key`` (``key=value``, or Hydra's forms of it)."""
    from asyncrl.config.overrides import override_key

    return any(override_key(o) == key for o in args.overrides)


def reading_bootstrap(cfg, role: str, named: bool = False) -> str:
    """The configured broker of a command that reads a run (inspect, audit, monitor, replay),
    checked first where a wrong guess is cheap to tell: a run_id that names no run here, or
    a loopback address nothing listens on (a finished run's embedded broker, whose port its
    saved config still names), fail at once instead of after the broker-down timeout."""
    if not cfg.kafka.bootstrap_servers:
        if not cfg.run_dir.exists():
            raise SystemExit(f"asyncrl {role}: {no_such_run(cfg)}")
        if not (cfg.run_dir / "config.yaml").exists():  # written once its set-up is done
            raise SystemExit(f"asyncrl {role}: {_no_saved_config(cfg)}")
        return need_bootstrap(cfg, role)
    closed = closed_loopback(cfg.kafka.bootstrap_servers)
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
    """Why a run directory with no config.yaml names no broker: a run with checkpoints or
    metrics had its trainer started by hand without `asyncrl prepare` (which writes it); a
    run with neither never got past its start-up (its logs/, where it has one, say why)."""
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


def output_dir_of(args: argparse.Namespace):
    """Where a command that reads a run finds RUN (a run_id): --output-dir, else output_dir=
    among the overrides (or --config's), as inspect takes it, with ``~`` expanded (in
    ``--output-dir=~/runs`` too: the shell expands no ``~`` after ``=``)."""
    from pathlib import Path

    from asyncrl.config import load_config

    given = args.output_dir or load_config(getattr(args, "config", None), args.overrides).output_dir
    return Path(given).expanduser()


def run_config(args: argparse.Namespace):
    """The config of RUN (``args.run``: a run_id under --output-dir, or a run directory): its
    resolved config.yaml when it has one, else --config; the command line's overrides on top.
    The saved config names the run's broker, so a live run is found without its address."""
    from pathlib import Path

    from asyncrl.config import load_config

    output_dir = output_dir_of(args)
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


def no_such_run(cfg, on_a_cluster: bool = True) -> str:
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


def closed_loopback(bootstrap: str) -> str | None:
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


def need_bootstrap(cfg, role: str) -> str:
    """The broker of a role or command that writes to one: kafka.bootstrap_servers, required."""
    if not cfg.kafka.bootstrap_servers:
        raise SystemExit(
            f"asyncrl {role}: kafka.bootstrap_servers is not set. Start a broker "
            "(`asyncrl broker`) and pass kafka.bootstrap_servers=HOST:PORT, or use `asyncrl run`."
        )
    return cfg.kafka.bootstrap_servers
