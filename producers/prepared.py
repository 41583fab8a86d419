"""The set-up's training prompts, saved in the run directory for the trainer's feed.

Reading ``data.train_files`` means checking every row and putting it through the chat
template and the tokenizer (the length filter): 10-30 s at 100K rows on two cores. The set-up
does it once, so that the trainer's feed (``FeedAhead``) need not do it again before its first
step while the workers wait: it writes what it read (the prompts' records, parquet, not
pickled) to ``<run_dir>/prepared/train.parquet`` with a key of everything that shaped them:
the files' bytes, the tokenizer's files, the run's ``data`` settings the read uses
(:data:`UNREAD_DATA_KEYS` are not), model, reward, tool and interaction settings. The trainer loads that; a missing, unreadable or stale file (another
key) is read again from the data files.

A resumed run's set-up loads it too (:func:`asyncrl.producers.feed.set_up_prompts`), with the
counts of the read that wrote it, and the counts of its check of ``data.val_files`` (``val.json``,
keyed alike), rather than reading and checking every row again (10-11 s of a resumed run's
16 s to its first step at 100K rows on two cores). The keys still hash the files'
bytes, so files changed since are read and checked again.
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
COUNTS = b"asyncrl.prepared_counts"
"""The read's counts (:class:`Read`, JSON), for the set-up's line of what was used."""
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
UNREAD_DATA_KEYS = frozenset({"feed_ahead_steps", "max_response_length", "shuffle", "seed"})
"""``data`` keys left out of the key: the read of the files does not use them. The saved
prompts are one epoch in file order (``feed.feed_sequence`` shuffles them by data.seed as it
feeds them), and a resume may change data.feed_ahead_steps and data.max_response_length,
which made it read and tokenize every row again. Any other data key is in the key."""


@dataclasses.dataclass(frozen=True)
class Read:
    """What the set-up's read of ``data.train_files`` counted."""

    total: int
    """Rows in the files."""
    too_long: int
    """Rows left out: longer than data.max_prompt_length tokens after the chat template."""
    earlier: bool = False
    """Loaded from the file an earlier set-up of the run saved, not read again."""


def path(cfg: RunConfig) -> Path:
    return cfg.run_dir / "prepared" / "train.parquet"


def val_path(cfg: RunConfig) -> Path:
    """The set-up's counts of ``data.val_files`` (:func:`save_val`), JSON."""
    return cfg.run_dir / "prepared" / "val.json"


def save_val(cfg: RunConfig, read: Read) -> None:
    """The counts of the set-up's check of ``data.val_files``, with their key, for a resumed
    run's set-up (:func:`load_val`): it imported torch and transformers for the tokenizer
    (3 s on two cores, beside the role server's imports) only to check the files again."""
    out = val_path(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    counts = {"key": prepared_key(cfg, "val"), "total": read.total, "too_long": read.too_long}
    tmp.write_text(json.dumps(counts))
    tmp.replace(out)


def load_val(cfg: RunConfig) -> Read | None:
    """What :func:`save_val` saved (``Read.earlier``), or None: none saved, unreadable, or
    saved with another key."""
    try:
        saved = json.loads(val_path(cfg).read_text())
        if saved["key"] != prepared_key(cfg, "val"):
            return None
        return Read(int(saved["total"]), int(saved["too_long"]), True)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _file_digest(file: Path, h: Any) -> None:
    h.update(str(file.name).encode())
    with file.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)


def prepared_key(cfg: RunConfig, split: str = "train") -> str:
    """A digest of everything that shapes the ``split``'s prompts read from the data files."""
    from asyncrl.models.policy import model_dir
    from asyncrl.producers.agent.interaction import run_interaction_names
    from asyncrl.producers.tools.registry import prompt_tool_schemas

    h = hashlib.sha256()
    settings = {
        "format": FORMAT,
        "data": cfg.data.model_dump(mode="json", exclude=set(UNREAD_DATA_KEYS)),
        "model": cfg.actor_rollout_ref.model.model_dump(mode="json"),
        "reward": cfg.custom_reward_function.path,
        "tools": prompt_tool_schemas(cfg),
        "interactions": run_interaction_names(cfg),
    }
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for name in cfg.data.train_paths if split == "train" else cfg.data.val_paths:
        _file_digest(Path(name).expanduser(), h)
    if cfg.actor_rollout_ref.model.path is not None:
        where = model_dir(cfg.actor_rollout_ref.model.path)
        for file in sorted(where.iterdir()) if where.is_dir() else []:
            if file.is_file() and file.name.startswith(TOKENIZER_PREFIXES):
                _file_digest(file, h)
    return h.hexdigest()


def save(cfg: RunConfig, train: list[PromptRecord], read: Read | None = None) -> Path:
    """Write ``train`` (the set-up's :func:`~asyncrl.producers.feed.train_prompts`) with the
    run's key and ``read``'s counts, whole or not at all (a temp file renamed over it)."""
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
    meta = {KEY: prepared_key(cfg).encode()}
    if read is not None:
        meta[COUNTS] = json.dumps({"total": read.total, "too_long": read.too_long}).encode()
    table = table.replace_schema_metadata(meta)
    out = path(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)
    return out


def load(cfg: RunConfig) -> list[PromptRecord] | None:
    """The prompts :func:`save` wrote for this run, or None: none saved, unreadable, or saved
    with another key (the data files, the tokenizer or a setting changed since)."""
    saved = _load(cfg)
    return None if saved is None else saved[0]


def load_read(cfg: RunConfig) -> tuple[list[PromptRecord], Read] | None:
    """:func:`load`, with the counts of the read that saved them (``Read.earlier``); None
    also where the file holds no counts (saved by an older asyncrl)."""
    saved = _load(cfg)
    if saved is None:
        return None
    records, read = saved
    return None if read is None else (records, read)


def _load(cfg: RunConfig) -> tuple[list[PromptRecord], Read | None] | None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    saved = path(cfg)
    if not saved.is_file() or not cfg.data.from_files:
        return None
    try:
        meta = pq.read_schema(saved).metadata or {}
        key = meta.get(KEY)
        if key is None or key.decode() != prepared_key(cfg):
            return None
        counts = json.loads(meta[COUNTS]) if COUNTS in meta else None
        read = None if counts is None else Read(counts["total"], counts["too_long"], True)
        columns = pq.read_table(saved).to_pydict()
        names = [f.name for f in dataclasses.fields(PromptRecord)]
        records = [PromptRecord(*row) for row in zip(*(columns[n] for n in names), strict=True)]
        return records, read
    except (pa.ArrowInvalid, OSError, TypeError, KeyError, ValueError):
        return None
