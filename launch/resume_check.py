"""What a resumed run may not change: the keys its log, topics and checkpoints were made with.

``asyncrl run`` of an unfinished run resumes it with the config of the new command line, and
rewrote ``runs/<run_id>/config.yaml`` with it: ``actor_rollout_ref.rollout.n=4`` on a run
started with 8 trained groups of 4 beside the groups of 8 on the log, the audit clean and the
old value gone; a changed model reached the trainer as a size mismatch in its checkpoint,
restarted ``trainer.max_restarts`` times. Such a change is refused at start-up, naming the
key; any other key (the learning rate, ``trainer.total_training_steps``, ``trainer.test_freq``,
the number of workers) resumes with its new value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from asyncrl.config import ConfigError, RunConfig

FIXED: dict[str, str] = {
    "actor_rollout_ref.model.": "the checkpoint holds that model's weights",
    "actor_rollout_ref.rollout.n": "the groups on the log have that many trajectories",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "the steps on the log and the version budgets count it",
    "async_training.require_batches": "the steps on the log and the version budgets count it",
    "async_training.partial_rollout": "the partial samples on the log follow it",
    "data.": "the prompts fed to the run's topic come from it",
    "kafka.topics.partitions.": "the run's topics were created with it",
}
"""Keys (a dotted name, or a prefix ending in a dot) fixed for a run's life, with why."""

FREE = {
    "actor_rollout_ref.model.cache_dir",  # where the warm start is kept, not which
    "actor_rollout_ref.model.trust_remote_code",
    "data.feed_ahead_steps",  # how the prompts reach the topic, not which
    "data.max_response_length",  # caps generation from now on
}
"""Keys under a prefix of FIXED that may change."""


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config's tree as {dotted key: value}; an empty mapping is a value of its own."""
    if not isinstance(tree, dict) or not tree:
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}."))
    return out


def _value(value: Any) -> str:
    """As it is written on a command line: true, null, 8, a path."""
    return value if isinstance(value, str) else json.dumps(value)


def fixed_why(key: str) -> str | None:
    """Why ``key`` cannot change when its run resumes (FIXED); None: it may."""
    if key in FREE:
        return None
    for name, why in FIXED.items():
        if key == name or (name.endswith(".") and key.startswith(name)):
            return why
    return None


def changed_fixed_keys(saved: dict[str, Any], cfg: RunConfig) -> list[tuple[str, Any, Any, str]]:
    """(key, value the run was started with, value now, why) of each fixed key that differs. A
    key the saved config lacks (written by an older asyncrl) is not compared."""
    before = flat(saved)
    now = flat(cfg.model_dump(mode="json"))
    return [
        (key, before[key], value, why)
        for key, value in now.items()
        if (why := fixed_why(key)) is not None and key in before and before[key] != value
    ]


def changed_key(cfg: RunConfig) -> tuple[str, str] | None:
    """(key, why in one line) of the first key the run in ``cfg.run_dir`` (its
    ``config.yaml``) was started with another value of, that it cannot change; None if none."""
    path = Path(cfg.run_dir) / "config.yaml"
    if not path.exists():
        return None
    saved = yaml.safe_load(path.read_text()) or {}
    changed = changed_fixed_keys(saved, cfg)
    if not changed:
        return None
    key, old, new, why = changed[0]
    more = f" (and {', '.join(c[0] for c in changed[1:])})" if len(changed) > 1 else ""
    fresh = (
        "another run_id=... (its log stays on the broker)"
        if cfg.kafka.bootstrap_servers
        else "trainer.resume_mode=disable (moves the earlier run aside) or another run_id=..."
    )
    return key, (
        f"{_value(new)}, but run {cfg.run_id!r} in {cfg.run_dir} was started with "
        f"{_value(old)}{more}, which cannot change when it resumes ({why}): resume it with "
        f"{key}={_value(old)}, or start afresh with {fresh}"
    )


def refuse_changed_keys(cfg: RunConfig) -> None:
    """Raise ConfigError, in one line, when the run about to be resumed (its ``config.yaml``
    in ``cfg.run_dir``) was started with another value of a key it cannot change."""
    if (found := changed_key(cfg)) is not None:
        raise ConfigError(f"{found[0]}: {found[1]}")
