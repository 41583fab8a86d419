"""The set-up's training prompts, saved in the run directory for the trainer's feed.

Reading ``data.train_files`` means checking every row and putting it through the chat
template and the tokenizer (the length filter): 10-30 s at 100K rows on two cores. The set-up
does it, and the trainer's feed (``FeedAhead``) did it again before its first step while the
workers waited. The set-up now writes what it read (the prompts' records, parquet, not
pickled) to ``<run_dir>/prepared/train.parquet`` with a key of everything that shaped them:
the files' bytes, the tokenizer's files, the run's ``data``, model, reward, tool and
interaction settings. The trainer loads that; a missing, unreadable or stale file (another
key) is read again from the data files, as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.schemas.prompt import PromptRecord

FORMAT = 1
"""Bumped when the reading of the data files changes what a prompt's record holds."""

KEY = b"asyncrl.prepared_key"
TOKENIZER_PREFIXES = (
    "tokenizer",
    "vocab",
    "merges",
    "special_tokens",
    "added_tokens",
    "chat_template",
    "config.json",
)
"""A checkpoint's files that make its tokenizer, chat template and vocab_size (not weights)."""


def path(cfg: RunConfig) -> Path:
    return cfg.run_dir / "prepared" / "train.parquet"


def _file_digest(file: Path, h: Any) -> None:
    h.update(str(file.name).encode())
    with file.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)


def prepared_key(cfg: RunConfig) -> str:
    """A digest of everything that shapes the training prompts read from the data files."""
    from asyncrl.models.policy import model_dir
    from asyncrl.producers.agent.interaction import run_interaction_names
    from asyncrl.producers.tools.registry import prompt_tool_schemas

    h = hashlib.sha256()
    settings = {
        "format": FORMAT,
        "data": cfg.data.model_dump(mode="json"),
        "model": cfg.actor_rollout_ref.model.model_dump(mode="json"),
        "reward": cfg.custom_reward_function.path,
        "tools": prompt_tool_schemas(cfg),
        "interactions": run_interaction_names(cfg),
    }
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for name in cfg.data.train_paths:
        _file_digest(Path(name).expanduser(), h)
    if cfg.actor_rollout_ref.model.path is not None:
        where = model_dir(cfg.actor_rollout_ref.model.path)
        for file in sorted(where.iterdir()) if where.is_dir() else []:
            if file.is_file() and file.name.startswith(TOKENIZER_PREFIXES):
                _file_digest(file, h)
    return h.hexdigest()


def save(cfg: RunConfig, train: list[PromptRecord]) -> Path:
    """Write ``train`` (the set-up's :func:`~asyncrl.producers.feed.train_prompts`) with the
    run's key, whole or not at all (a temp file renamed over it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = [f.name for f in dataclasses.fields(PromptRecord)]
    table = pa.Table.from_pydict(
        {n: [getattr(r, n) for r in train] for n in names},
        schema=pa.schema(
            [(n, pa.string()) for n in names if n not in ("epoch", "ground_truth_json")]
            + [("epoch", pa.int64()), ("ground_truth_json", pa.bool_())]
        ),
    ).select(names)
    table = table.replace_schema_metadata({KEY: prepared_key(cfg).encode()})
    out = path(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)
    return out


def load(cfg: RunConfig) -> list[PromptRecord] | None:
    """The prompts :func:`save` wrote for this run, or None: none saved, unreadable, or saved
    with another key (the data files, the tokenizer or a setting changed since)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    saved = path(cfg)
    if not saved.is_file() or not cfg.data.from_files:
        return None
    try:
        key = (pq.read_schema(saved).metadata or {}).get(KEY)
        if key is None or key.decode() != prepared_key(cfg):
            return None
        columns = pq.read_table(saved).to_pydict()
        names = [f.name for f in dataclasses.fields(PromptRecord)]
        return [PromptRecord(*row) for row in zip(*(columns[n] for n in names), strict=True)]
    except (pa.ArrowInvalid, OSError, TypeError, KeyError, ValueError):
        return None
