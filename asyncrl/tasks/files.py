"""Datasets in verl's format: parquet files as verl's preprocessing scripts write them.

One row per prompt, columns (verl's ``RLHFDataset``):

* ``data_source`` (str): which reward rule applies (the custom reward function gets it);
* the prompt, in the column ``data.prompt_key`` (default ``prompt``): a list of chat messages
  ``{"role", "content"}`` (or a plain string);
* ``ability`` (str, optional): a label, not used;
* ``reward_model``: ``{"style": "rule", "ground_truth": ...}``;
* ``extra_info`` (dict, optional): passed to the reward function (e.g. ``index``, ``split``).

Rows keep their order; a row's prompt id is ``<file stem>-<row>`` (several files:
``<file index>.<stem>-<row>``), so every process names a prompt alike. Prompts longer than
``data.max_prompt_length`` tokens after the chat template are left out and counted
(:func:`load_split`). :func:`export_task` writes a built-in task in this format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import ConfigError
from asyncrl.schemas.prompt import PromptRecord

if TYPE_CHECKING:
    from asyncrl.config import DataConfig, RunConfig

REQUIRED = ("data_source", "reward_model")
BUILTIN_SOURCES = ("arithmetic", "calculator", "countdown")
"""data_source values a built-in rule scores (the shipped tasks), with no custom reward."""


@dataclass(frozen=True)
class DataRow:
    """One prompt of a dataset file, with what its reward needs."""

    prompt_id: str
    prompt: str | list[dict[str, Any]]
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)
    ability: str = ""

    @property
    def messages(self) -> list[dict[str, Any]] | None:
        return None if isinstance(self.prompt, str) else self.prompt

    @property
    def answer(self) -> str:
        """The ground truth as text (what a sample's ``ground_truth`` column holds)."""
        gt = self.ground_truth
        return gt if isinstance(gt, str) else json.dumps(gt)

    def record(self, epoch: int = 0) -> PromptRecord:
        """This row as a message of the ``prompts`` topic."""
        messages = self.messages
        return PromptRecord(
            prompt_id=self.prompt_id,
            prompt=self.prompt
            if isinstance(self.prompt, str)
            else str(self.prompt[-1].get("content", "")),
            ground_truth=self.answer,
            epoch=epoch,
            data_source=self.data_source,
            messages="" if messages is None else json.dumps(messages),
            extra_info=json.dumps(self.extra_info) if self.extra_info else "",
            ground_truth_json=not isinstance(self.ground_truth, str),
        )


@dataclass
class Split:
    rows: list[DataRow]
    total: int
    """Rows in the files."""
    too_long: int
    """Rows left out: longer than data.max_prompt_length tokens after templating."""


def _prompt_ids(paths: list[str]) -> Callable[[int, int], str]:
    stems = [Path(p).stem for p in paths]
    if len(paths) == 1:
        return lambda _k, row: f"{stems[0]}-{row}"
    return lambda k, row: f"{k}.{stems[k]}-{row}"


def _plain(value: Any) -> Any:
    """numpy arrays (a parquet list read through pandas) as Python lists, recursively."""
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return _plain(value.tolist())
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _json_typed(type_: Any) -> bool:
    """Whether every value of the Arrow type ``type_`` reads (``to_pylist``) as JSON already:
    strings, integers, bools, 32/64-bit floats (NaN and infinities too, which ``json.dumps``
    writes and :func:`_check_json` lets through), nulls, and lists and structs of those. Such a
    column needs no :func:`_plain` nor :func:`_check_json` per value, which would cost a third
    of :func:`read_rows` (0.6 of 1.8 s per 100K gsm8k rows, 1 of 3.3 s with a 12-key
    ``extra_info``); any other type (binary, timestamp, decimal, map, dictionary, a view, an
    extension) keeps the per-value check and its error."""
    import pyarrow.types as t

    if t.is_list(type_) or t.is_large_list(type_) or t.is_fixed_size_list(type_):
        return _json_typed(type_.value_type)
    if t.is_struct(type_):
        return all(_json_typed(type_.field(i).type) for i in range(type_.num_fields))
    scalars = (t.is_null, t.is_boolean, t.is_integer, t.is_string, t.is_large_string)
    return any(is_(type_) for is_ in scalars) or t.is_float32(type_) or t.is_float64(type_)


def _column_json(schema: Any, column: str, field: str | None = None) -> bool:
    """Whether ``column`` (its struct field ``field``) of ``schema`` is :func:`_json_typed`.
    An absent column reads as nulls (True); a name that is not unique, or a ``field`` the
    column's type lacks, is False: the per-value path and its errors handle them."""
    at = schema.get_field_index(column)
    if at < 0:
        return column not in schema.names  # absent: read as null
    type_ = schema.field(at).type
    if field is not None:
        if not (hasattr(type_, "get_field_index") and type_.get_field_index(field) >= 0):
            return False
        type_ = type_.field(type_.get_field_index(field)).type
    return _json_typed(type_)


def _prompt(value: Any, where: str, key: str) -> str | list[dict[str, Any]]:
    if isinstance(value, str):
        if _json_messages(value):  # would go to the model as text, bypassing the template
            raise ConfigError(
                f"{where}: column {key!r} (data.prompt_key) holds chat messages encoded as a "
                "JSON string; store them as a list of {role, content} (verl's format: "
                "df[key] = df[key].map(json.loads) before writing the parquet)"
            )
        return value
    ok = (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in value
        )
    )
    if not ok:
        raise ConfigError(
            f"{where}: column {key!r} (data.prompt_key) must hold chat messages "
            f"[{{role, content}}, ...] or a string, not {str(value)[:80]!r}"
        )
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _json_messages(text: str) -> bool:
    """Whether ``text`` is chat messages serialised as JSON (a string column where verl's
    format has a list): read as a plain prompt it silently skipped the chat template."""
    if not text.lstrip().startswith("[{"):
        return False
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value)


def check_file(path: str, prompt_key: str) -> str | None:
    """Why ``path`` cannot be read as a dataset (no such file, not parquet, a column missing),
    ``"<path>: <why>"``, or None. Reads the parquet footer alone, not the rows: the start-up
    checks (launch/preflight.py) run it too, so a dry run finds what :func:`read_rows` would."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not Path(path).expanduser().is_file():
        return f"{path}: no such file"
    try:
        columns = pq.read_schema(Path(path).expanduser()).names
    except (pa.ArrowInvalid, OSError) as err:
        return f"{path}: not a parquet file ({err})"
    missing = [c for c in (prompt_key, *REQUIRED) if c not in columns]
    if not missing:
        return None
    return (
        f"{path}: no column {', '.join(map(repr, missing))}"
        + (" (data.prompt_key)" if prompt_key in missing else "")
        + f"; its columns: {', '.join(columns)}"
    )


def read_rows(paths: list[str], prompt_key: str, config_key: str) -> list[DataRow]:
    """Every row of ``paths`` (read in order); ConfigError names ``config_key`` and the file
    for a missing file, a missing column or a malformed value."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from asyncrl.kafka.records import progress_counter

    ids = _prompt_ids(paths)
    rows: list[DataRow] = []
    counted = progress_counter(f"reading {config_key}")  # a live line: 1M rows take a minute
    for k, path in enumerate(paths):
        where = f"{config_key}: {path}"
        problem = check_file(path, prompt_key)
        if problem is not None:
            raise ConfigError(f"{config_key}: {problem}")
        try:
            table = pq.read_table(Path(path).expanduser())
        except (pa.ArrowInvalid, OSError) as err:
            raise ConfigError(f"{where}: not a parquet file ({err})") from None
        # columns whose Arrow type holds JSON only skip the per-value conversion and check
        json_prompt = _column_json(table.schema, prompt_key)
        json_truth = _column_json(table.schema, "reward_model", "ground_truth")
        json_extra = _column_json(table.schema, "extra_info")
        for i, row in enumerate(table.to_pylist()):
            reward_model = row["reward_model"]
            if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
                raise ConfigError(f"{where}: row {i}: reward_model has no ground_truth")
            extra = row.get("extra_info") or {}
            if not isinstance(extra, dict):
                raise ConfigError(f"{where}: row {i}: extra_info must be a mapping")
            ground_truth = reward_model["ground_truth"]
            if not json_truth:
                ground_truth = _plain(ground_truth)
                _check_json(ground_truth, f"{where}: row {i}: reward_model.ground_truth")
            if not json_extra:
                extra = _plain(extra)
                _check_json(extra, f"{where}: row {i}: extra_info")
            prompt = row[prompt_key] if json_prompt else _plain(row[prompt_key])
            rows.append(
                DataRow(
                    prompt_id=ids(k, i),
                    prompt=_prompt(prompt, f"{where}: row {i}", prompt_key),
                    data_source=str(row["data_source"]),
                    ground_truth=ground_truth,
                    extra_info=extra,
                    ability=str(row.get("ability") or ""),
                )
            )
            counted(len(rows))
    return rows


def _check_json(value: Any, where: str) -> None:
    """ConfigError unless ``value`` is JSON, as the prompts topic carries it to the reward: a
    timestamp, decimal or bytes column stopped the feed with a TypeError traceback."""
    items = value.items() if isinstance(value, dict) else [(None, value)]
    for key, item in items:
        try:
            json.dumps(item)
        except (TypeError, ValueError) as err:
            raise ConfigError(
                f"{where}{'' if key is None else f'[{key!r}]'}: {err} (the reward function "
                "gets it as JSON: strings, numbers, bools, lists and dicts); store it as one "
                "of those"
            ) from None


ENCODE_BATCH = 1024
"""Prompts tokenized in one call (``asyncrl.models.policy.encode_texts``)."""


def filter_overlong(
    rows: list[DataRow],
    tokenizer: Any,
    max_prompt_length: int,
    vocab_size: int | None = None,
    tools: list[dict[str, Any]] | None = None,
    chat_kwargs: dict[str, Any] | None = None,
) -> tuple[list[DataRow], int]:
    """(rows whose prompt is at most ``max_prompt_length`` tokens after the chat template,
    with ``tools`` and ``chat_kwargs`` as the workers encode it, how many were longer). ConfigError for a prompt
    with a token id the model does not embed
    (``vocab_size``): tokens added to a tokenizer whose model was not resized made the
    trainer and the workers die on IndexError, restarted until the run failed."""
    from asyncrl.kafka.records import progress_counter
    from asyncrl.models.policy import PATH_KEY, encode_texts, prompt_text

    def fits(row: DataRow, ids: list[int]) -> bool:
        past = [i for i in ids if vocab_size is not None and i >= vocab_size]
        if past:
            raise ConfigError(
                f"prompt {row.prompt_id}: token {tokenizer.convert_ids_to_tokens(past[0])!r} "
                f"(id {past[0]}) is past the model's vocab_size={vocab_size} ({PATH_KEY}'s "
                f"config.json): its tokenizer has {len(tokenizer)} tokens; resize the model's "
                "embeddings to them (model.resize_token_embeddings(len(tokenizer))) and save it"
            )
        return len(ids) <= max_prompt_length

    counted = progress_counter("tokenizing the prompts")
    kept = []
    for start in range(0, len(rows), ENCODE_BATCH):
        chunk, texts = rows[start : start + ENCODE_BATCH], []
        failed = None
        for row in chunk:
            try:
                texts.append(prompt_text(tokenizer, row.prompt, tools, chat_kwargs))
            except ConfigError as err:  # which prompt: the template may refuse only some
                failed = ConfigError(f"prompt {row.prompt_id}: {err}")
                break
        # the rows before a refused one first: the first row at fault is the one named
        encoded = zip(chunk[: len(texts)], encode_texts(tokenizer, texts), strict=True)
        for done, (row, ids) in enumerate(encoded, start + 1):
            if fits(row, ids):
                kept.append(row)
            counted(done)
        if failed is not None:
            raise failed
    return kept, len(rows) - len(kept)


def _text(prompt: str | list[dict[str, Any]]) -> str:
    """What the built-in model reads of a prompt: its chat template is the messages' text."""
    if isinstance(prompt, str):
        return prompt
    return "".join(str(m.get("content", "")) for m in prompt)


def refuse_unknown_characters(key: str, rows: list[DataRow], tokenizer: Any) -> None:
    """ConfigError where a prompt holds characters the built-in tiny model's tokenizer lacks:
    each read as ``<unk>``, so a user's own data with the built-in model trained on noise
    without a word (the model knows its task's few characters, digits and ``+-*=()``)."""
    vocab = tokenizer.get_vocab()
    unknown: dict[str, None] = {}
    hit: list[DataRow] = []
    for row in rows:
        missing = [c for c in _text(row.prompt) if c not in vocab]
        if missing:
            hit.append(row)
            unknown.update(dict.fromkeys(missing))
    if not hit:
        return
    known = "".join(t for t in sorted(vocab, key=vocab.__getitem__) if len(t) == 1)
    shown = "".join(list(unknown)[:20]) + ("..." if len(unknown) > 20 else "")
    raise ConfigError(
        f"{key}: {len(hit)} of {len(rows)} prompts hold characters the built-in tiny model's "
        f"tokenizer does not have ({shown!r}; it knows {known!r} only), e.g. prompt "
        f"{hit[0].prompt_id}: {_text(hit[0].prompt)[:80]!r}: each would read as <unk>; set "
        "actor_rollout_ref.model.path to a checkpoint whose tokenizer reads your data"
    )


def load_split(
    cfg: RunConfig,
    split: str,
    tokenizer: Any,
    rows: list[DataRow] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> Split:
    """The ``train`` or ``val`` rows of ``data.train_files``/``val_files`` (or ``rows``, read
    from them already), over-long prompts left out, counting ``tools`` (the schemas a chat
    template writes: ``asyncrl.producers.agent.data`` passes the run's)."""
    key = f"data.{split}_files"
    rows = checked_rows(cfg, split) if rows is None else rows
    from asyncrl.models.policy import vocab_size

    path = cfg.actor_rollout_ref.model.path
    embedded = None if path is None else vocab_size(path)
    if path is None:
        refuse_unknown_characters(key, rows, tokenizer)
    try:
        kept, too_long = filter_overlong(
            rows,
            tokenizer,
            cfg.data.max_prompt_length,
            embedded,
            tools,
            cfg.data.apply_chat_template_kwargs,
        )
    except ConfigError as err:
        raise ConfigError(f"{key}: {err}") from None
    if not kept:
        raise ConfigError(
            f"{key}: all {len(rows)} prompts are longer than data.max_prompt_length="
            f"{cfg.data.max_prompt_length} tokens after the chat template"
        )
    return Split(kept, len(rows), too_long)


def checked_rows(
    cfg: RunConfig, split: str, interactions: list[str] | None = None
) -> list[DataRow]:
    """The rows of a split with every check that needs no tokenizer (well-formed values, at
    least one row, a reward for each data_source, with ``interactions``, the names of the
    run's, one picked by each row): what ``asyncrl run --dry-run`` reads."""
    key = f"data.{split}_files"
    paths = cfg.data.train_paths if split == "train" else cfg.data.val_paths
    rows = read_rows(paths, cfg.data.prompt_key, key)
    if not rows:
        raise ConfigError(f"{key}: no rows in {', '.join(paths)}")
    if cfg.custom_reward_function.path is None:
        unknown = sorted({r.data_source for r in rows} - set(BUILTIN_SOURCES))
        if unknown:
            raise ConfigError(
                f"custom_reward_function.path: not set, and {key} holds data_source "
                f"{', '.join(unknown)}, which no built-in rule scores (built-in: "
                f"{', '.join(BUILTIN_SOURCES)}): name your compute_score file"
            )
    if interactions is not None:
        for row in rows:
            try:
                pick_interaction(interactions, row.extra_info.get("interaction_kwargs"))
            except ValueError as err:  # else a worker would meet the row mid-run
                raise ConfigError(f"{key}: prompt {row.prompt_id}: {err}") from None
    return rows


INTERACTION_KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


def pick_interaction(names: list[str], kwargs: Any) -> str:
    """The interaction a sample's ``extra_info.interaction_kwargs`` picks among ``names`` (the
    run's): the one its ``name`` names, or, with one configured, that one when it names none
    (verl requires the name; here the built-in tasks, which have no ``extra_info``, can use
    an interaction). The one rule of the data check at load and of the workers at run time;
    ValueError naming the key if it picks none."""
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(
            f"extra_info.interaction_kwargs: must be a mapping, not {type(kwargs).__name__}"
        )
    name = (kwargs or {}).get("name")
    if name is None:
        if len(names) == 1:
            return names[0]
        raise ValueError(
            f"extra_info.interaction_kwargs.name: missing; {INTERACTION_KEY} has "
            f"{', '.join(names)}: a sample picks one by name"
        )
    if name not in names:
        raise ValueError(
            f"extra_info.interaction_kwargs.name: {name!r} is not in {INTERACTION_KEY} (it has "
            f"{', '.join(names)})"
        )
    return str(name)


# --- the built-in tasks in this format ----------------------------------------------------------
ABILITY = {"arithmetic": "math", "calculator": "math", "countdown": "math"}


def task_rows(data_cfg: DataConfig) -> dict[str, list[dict[str, Any]]]:
    """``data.task``'s train and val prompts as verl-format rows (one user message each)."""
    from asyncrl.tasks import splits

    train, val = splits(data_cfg)
    out: dict[str, list[dict[str, Any]]] = {}
    for name, problems in (("train", train), ("val", val)):
        out[name] = [
            {
                "data_source": data_cfg.task,
                "prompt": [{"role": "user", "content": p.prompt}],
                "ability": ABILITY.get(data_cfg.task, "math"),
                "reward_model": {"style": "rule", "ground_truth": p.answer},
                "extra_info": {"split": name, "index": i, "prompt_id": p.prompt_id},
            }
            for i, p in enumerate(problems)
        ]
    return out


def export_task(data_cfg: DataConfig, out_dir: Path) -> dict[str, Path]:
    """Write ``train.parquet`` and ``val.parquet`` of ``data.task`` into ``out_dir``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, rows in task_rows(data_cfg).items():
        path = out_dir / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        written[name] = path
    return written
