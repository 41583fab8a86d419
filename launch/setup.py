"""A run's set-up, before any of its processes starts (``asyncrl run``, ``asyncrl prepare``).

1. The prompts read and checked (data.train_files, data.val_files), before the topics and a
   warm start: a bad file fails the run at once.
2. The run's topics, created; a log on the broker that this run directory did not write refused.
3. The policy: built and warm-started once (cached), so every process loads the same weights.
4. The prompts topic fed with the first steps' prompts (unless a resumed trainer feeds them).
5. The resolved config every process reads, written to ``run_dir/config.yaml``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console

from asyncrl.config import ConfigError, RunConfig, dump_config
from asyncrl.kafka.topics import create_run_topics
from asyncrl.launch.broker import free_port
from asyncrl.launch.progress import records_shown

LAUNCHER_LOG = "launcher.log"
"""The launcher's own log in ``run_dir/logs``: the spans of ``tracing.exporter=console``,
which its stdout, the live progress, would drown (a 4-step run: 9,500 lines of JSON)."""


def prepare_policy(cfg: RunConfig, console: Console) -> None:
    """Build and warm-start the policy once, before any process needs it. A cached one is
    only looked up (no torch here: the roles load it)."""
    from asyncrl.models.cache import policy_dir, warm_start_metrics

    if cfg.actor_rollout_ref.model.path is not None:
        from asyncrl.models.policy import load_tokenizer

        load_tokenizer(cfg)  # fails now, naming actor_rollout_ref.model.path, if it cannot load
        console.log(
            f"policy: {cfg.actor_rollout_ref.model.path} (actor_rollout_ref.model.path; "
            "loaded by each process, no warm start)"
        )
        return
    t0 = time.monotonic()
    ws = warm_start_metrics(cfg)
    if ws is None:
        console.log(f"warm-starting the policy (once per config; cached in {policy_dir(cfg)})")
        _warm_start(cfg, console)
        ws = warm_start_metrics(cfg) or {}
    acc = ws.get("warmup_val_accuracy")
    console.log(
        f"policy ready in {time.monotonic() - t0:.1f} s"
        + (f" (warm start: held-out accuracy {acc:.3f})" if acc is not None else "")
    )


def _warm_start(cfg: RunConfig, console: Console) -> None:
    """The warm start itself (~1 min on two cores), with a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from asyncrl.models.warm_start import load_policy

    with Progress(
        TextColumn("[bold]warm start"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("", total=cfg.actor_rollout_ref.model.warmup_steps)

        def on_step(step: int, total: int, loss: float) -> None:
            progress.update(task, completed=step, description=f"loss {loss:.3f}")

        load_policy(cfg, on_step=on_step)


def _log_data(cfg: RunConfig, console: Console, split: str, read: Any) -> None:
    """How many prompts of data.<split>_files are used, and how many were too long
    (``read``: a ``producers.prepared.Read``)."""
    from asyncrl.producers import prepared

    limit = f"data.max_prompt_length={cfg.data.max_prompt_length}"
    console.log(
        f"data: {read.total - read.too_long} of the {read.total} prompts in data.{split}_files"
        + (
            f" ({read.too_long} longer than {limit} tokens after the chat template: left out)"
            if read.too_long
            else f" (all within {limit} tokens)"
        )
        + (
            f"; the files unchanged since the run's set-up read them: not read again "
            f"({prepared.path(cfg).parent})"
            if read.earlier
            else ""
        )
    )


def read_data(cfg: RunConfig, console: Console) -> list[Any]:
    """The training prompts of the feed, and data.val_files checked; says how many of each
    the run uses. A resumed run's set-up takes both as its first set-up read them where the
    files are unchanged (``producers/prepared.py``)."""
    from asyncrl.producers import prepared
    from asyncrl.producers.feed import set_up_prompts

    with records_shown(console, "reading the prompts", "prepare"):  # 1M rows: minutes
        train, read = set_up_prompts(cfg)
    if read is None:
        return train
    _log_data(cfg, console, "train", read)
    val = prepared.load_val(cfg)
    if val is None:  # the tokenizer imports torch and transformers: not for nothing
        from asyncrl.models.policy import load_tokenizer
        from asyncrl.producers.agent.data import load_split

        split = load_split(cfg, "val", load_tokenizer(cfg))
        val = prepared.Read(split.total, split.too_long)
        prepared.save_val(cfg, val)
    _log_data(cfg, console, "val", val)
    return train


def prepare(cfg: RunConfig, bootstrap: str, console: Console) -> tuple[RunConfig, Path]:
    """Everything a run needs before its processes start: topics, the warm-started policy,
    the prompts, and the resolved config every process reads (``run_dir/config.yaml``).

    ``asyncrl run`` calls it before spawning; ``asyncrl prepare`` runs it alone (the set-up
    service of the compose cluster, or a multi-node run's first step).
    """
    resolved = cfg.model_copy(deep=True)
    resolved.kafka.bootstrap_servers = bootstrap
    if resolved.sync.master_port is None:
        resolved.sync.master_port = free_port()
    from asyncrl.kafka import count_records
    from asyncrl.producers.feed import feeds_ahead

    # The data first (the tokenizer needs no warm start): prompts all over
    # data.max_prompt_length, or characters the built-in model cannot read, stopped the run
    # only after the topics and a ~45 s warm start.
    train = read_data(resolved, console)
    topics = create_run_topics(resolved, bootstrap)
    console.log(f"topics: {', '.join(topics)}")
    _refuse_a_foreign_log(resolved, bootstrap)
    prepare_policy(resolved, console)
    ahead, topic = resolved.data.feed_ahead_steps, resolved.topic("prompts")
    # A resumed run whose trainer feeds and has trained: before its first step the trainer
    # reads the topic for the prompts on it (FeedAhead, through a later step than the set-up's
    # feed), so the set-up does not read it too (that would read a long run's prompts twice at
    # every resume). A run with no samples yet is checked and fed here, and its trainer reads
    # nothing back (FeedAhead._only_the_set_ups).
    trained = feeds_ahead(resolved) and count_records(
        resolved.kafka, bootstrap, resolved.topic("samples")
    )
    on_topic = count_records(resolved.kafka, bootstrap, topic) if trained else 0
    if on_topic:
        console.log(
            f"{on_topic} prompts on {topic} already: the trainer checks them before its "
            f"first step and feeds the rest, {ahead} steps ahead"
        )
    else:
        _feed(resolved, bootstrap, console, cfg.run_dir / "logs" / LAUNCHER_LOG, train)
    config_path = cfg.run_dir / "config.yaml"
    dump_config(resolved, config_path)
    console.log(f"resolved config: {config_path}")
    return resolved, config_path


def _feed(
    cfg: RunConfig, bootstrap: str, console: Console, trace_log: Path, train: list[Any]
) -> None:
    """The set-up's feed: a long run's first steps' prompts, checked and fed, shown live on
    a terminal; the feed's spans (the prompts' contexts) go to ``trace_log``, not the
    terminal."""
    from asyncrl.producers.feed import feed_prompts, feeds_ahead
    from asyncrl.telemetry.tracing import init_tracing, shutdown_tracing

    init_tracing(cfg, "asyncrl-launcher", console_log=trace_log)
    try:
        with records_shown(console, "checking the prompts already fed", "prepare"):
            written, present = feed_prompts(cfg, bootstrap, train=train)
    finally:
        shutdown_tracing()
    ahead = cfg.data.feed_ahead_steps
    console.log(
        f"fed {written} prompts to {cfg.topic('prompts')}"
        + (f" ({present} were there already: not fed twice)" if present else "")
        + (f"; the trainer feeds the rest, {ahead} steps ahead" if feeds_ahead(cfg) else "")
    )


def _refuse_a_foreign_log(cfg: RunConfig, bootstrap: str) -> None:
    """A run directory that never held this run (no config.yaml: another output_dir, or the
    directory deleted) in front of a log a trainer has trained on (a Kafka cluster keeps a
    run's log): a trainer started here would find no checkpoint, void every step on the log
    (a finished run's too) and train on its samples again from the first policy. Refused, as
    the user meant one of the two it cannot tell apart. Samples alone are no sign of another
    run (``replay topic --to-run`` feeds a new run's trainer that way)."""
    if (cfg.run_dir / "config.yaml").exists():
        return
    from asyncrl.kafka.records import read_records
    from asyncrl.schemas import DecodeError
    from asyncrl.schemas.step import decode_step

    for rec in read_records(cfg, bootstrap, "steps"):
        try:
            step = decode_step(rec.value, rec.headers)
        except DecodeError:
            continue
        raise ConfigError(
            f"run_id={cfg.run_id}: the broker at {bootstrap} already holds this run's log, "
            f"trained to step {step.step} at least, which {cfg.run_dir} did not write (it has "
            "no config.yaml): resume that run with the output_dir it was started with, or "
            "start a new one under another run_id="
        )
