"""The config's file paths made absolute once, at load, against the directory the command runs
in: the saved ``runs/<run_id>/config.yaml`` then holds absolute paths, so every role started
from it (``asyncrl train``/``rollout``, a compose service, ``replay``) reads the same files
whatever its own working directory. A relative path read from ``runs/<run_id>/config.yaml``
by ``asyncrl train`` in another directory had named that directory's files instead."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from asyncrl.config.sections import RunConfig

PATH_KEYS = (
    "output_dir",
    "data.train_files",
    "data.val_files",
    "custom_reward_function.path",
    "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.cache_dir",
    "kafka.security.ssl_ca_location",
    "kafka.security.ssl_certificate_location",
    "kafka.security.ssl_key_location",
)
"""Every key naming a local file or directory. ``model.path`` may be a Hub id instead
(``Qwen/Qwen2.5-0.5B-Instruct``): it is made absolute only where it names something here."""


def absolute(path: str, base: Path) -> str:
    """``path`` (``~`` expanded) from ``base`` unless already absolute; a URL (``hdfs://``) as
    it is."""
    if "://" in path:
        return path
    expanded = os.path.expanduser(path)
    return expanded if os.path.isabs(expanded) else os.path.normpath(base / expanded)


def section_of(cfg: RunConfig, key: str) -> tuple[Any, str]:
    """The config object holding dotted ``key`` and the key's last name, to get or set it."""
    *parents, leaf = key.split(".")
    section: Any = cfg
    for name in parents:
        section = getattr(section, name)
    return section, leaf


def make_paths_absolute(cfg: RunConfig, base: Path) -> None:
    """Every relative path of ``cfg`` (PATH_KEYS) taken from ``base``, in place."""
    for key in PATH_KEYS:
        section, leaf = section_of(cfg, key)
        value = getattr(section, leaf)
        model = key == "actor_rollout_ref.model.path" and isinstance(value, str)
        if model and not os.path.exists(absolute(value, base)):
            continue  # a Hub id, or a missing directory the start-up check names as written
        if isinstance(value, str):
            setattr(section, leaf, absolute(value, base))
        elif isinstance(value, list):
            setattr(section, leaf, [absolute(v, base) for v in value])
