"""Where the warm-started demo policy is kept, under which key, and whether it is there.

Importable without torch or transformers: ``asyncrl run`` asks whether the policy is cached
before any role starts, and importing them there cost ~2 s of every run's start-up while the
fork server imported the same modules for the roles (``launch/process.py``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncrl.config import RunConfig

CHARS = "0123456789+-*=() "
"""Every character the demo tokenizer knows; anything else maps to <unk>."""
CACHE_FORMAT = 3
"""Bump when the tokenizer, architecture or warm-start recipe changes: it invalidates caches."""
METRICS_FILE = "warm_start.json"
"""Written last into a cache entry: its presence marks the entry complete."""

NOT_IN_CACHE_KEY = {
    "model": {"cache_dir", "path", "trust_remote_code", "override_config"},  # path's alone
    # Response length caps generation only, not the warm start (answers are <= 4 tokens),
    # so benchmarks with long modelled responses reuse the demo's policy. Dataset files feed
    # RL only (the warm start is on data.task's problems).
    "data": {
        "max_response_length",
        "train_files",
        "val_files",
        "prompt_key",
        "shuffle",
        "feed_ahead_steps",  # how the prompts reach the topic, not which
    },
}
"""Config fields that do not change the warm-started weights."""


def cache_key(cfg: RunConfig) -> str:
    """Hash of everything that determines the warm-started weights (not where they are kept)."""
    spec = {
        "format": CACHE_FORMAT,
        "model": cfg.actor_rollout_ref.model.model_dump(
            mode="json", exclude=NOT_IN_CACHE_KEY["model"]
        ),
        "data": cfg.data.model_dump(mode="json", exclude=NOT_IN_CACHE_KEY["data"]),
        "chars": CHARS,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def policy_dir(cfg: RunConfig) -> Path:
    """Where ``asyncrl.models.tiny.load_policy`` keeps this config's warm-started model."""
    root = cfg.actor_rollout_ref.model.cache_dir
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "asyncrl" / "models"
    return base / cache_key(cfg)


def warm_start_metrics(cfg: RunConfig) -> dict[str, Any] | None:
    """The metrics recorded when this config's cached policy was built (None if not cached)."""
    path = policy_dir(cfg) / METRICS_FILE
    return json.loads(path.read_text()) if path.exists() else None
