"""The catalogue of asyncrl's config keys, walked from the models: is a dotted key ours, a section
or a leaf, what is its default, and which valid key is nearest to a mistyped one."""

from __future__ import annotations

import difflib
import types
import typing
from functools import cache
from typing import Any, TypeGuard

from pydantic import BaseModel

from asyncrl.config import verl_keys
from asyncrl.config.sections import RunConfig

_MISSING = object()


def _is_section(ann: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def our_key(key: str) -> tuple[str, str | None] | None:
    """``(field, rest)`` when ``key`` is asyncrl's: ``rest`` is a key inside a dict field
    (``kafka.extra.socket.timeout.ms``: field ``kafka.extra``, rest ``socket.timeout.ms``)."""
    model: type[BaseModel] = RunConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        info = model.model_fields.get(part)
        if info is None:
            return None
        last = i == len(parts) - 1
        if _is_section(info.annotation):
            if last:
                return key, None
            model = info.annotation
            continue
        if last:
            return key, None
        if typing.get_origin(info.annotation) is dict:
            return ".".join(parts[: i + 1]), ".".join(parts[i + 1 :])
        return None
    return None


def _is_our_section(key: str) -> bool:
    model: Any = RunConfig
    for part in key.split("."):
        info = model.model_fields.get(part) if _is_section(model) else None
        if info is None:
            return False
        model = info.annotation
    return _is_section(model)


def leaf_of(loc: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
    """A validation error's location split into the key the user sets (a leaf, a key inside a
    dict field, or a section for a check across its keys) and what pydantic adds below it: a
    list index, or the member of a union it tried (``str``, ``list[str]``)."""
    model: Any = RunConfig
    for i, part in enumerate(loc):
        info = model.model_fields.get(part) if _is_section(model) else None
        if info is None:
            break
        if _is_section(info.annotation):
            model = info.annotation
            continue
        end = i + 2 if typing.get_origin(info.annotation) is dict and i + 1 < len(loc) else i + 1
        return ".".join(str(p) for p in loc[:end]), tuple(loc[end:])
    return ".".join(str(p) for p in loc), ()


def _is_our_leaf(key: str) -> bool:
    found = our_key(key)
    return found is not None and found[1] is None and not _is_our_section(key)


@cache
def our_leaf_keys() -> tuple[str, ...]:
    """Every settable key of asyncrl's config, dotted."""

    def walk(model: type[BaseModel], prefix: str) -> list[str]:
        keys = []
        for name, info in model.model_fields.items():
            if _is_section(info.annotation):
                keys += walk(info.annotation, f"{prefix}{name}.")
            else:
                keys.append(f"{prefix}{name}")
        return keys

    return tuple(walk(RunConfig, ""))


def _leaf_field(key: str) -> Any:
    """The pydantic field of asyncrl's leaf ``key`` (not a section), or None."""
    model: Any = RunConfig
    info = None
    for part in key.split("."):
        info = model.model_fields.get(part) if _is_section(model) else None
        if info is None:
            return None
        model = info.annotation
    return None if info is None or _is_section(info.annotation) else info


def default_of(key: str) -> Any:
    """asyncrl's default for a leaf key, or _MISSING."""
    info = _leaf_field(key)
    return _MISSING if info is None else info.get_default(call_default_factory=True)


def annotation_of(key: str) -> Any:
    """The type of asyncrl's leaf ``key`` (``int``, ``str | None``, ...), or _MISSING."""
    info = _leaf_field(key)
    return _MISSING if info is None else info.annotation


def scalar_types(key: str) -> set[Any]:
    """The scalar types asyncrl's leaf ``key`` accepts (None and containers left out)."""
    return _scalar_types(annotation_of(key))


def _scalar_types(ann: Any) -> set[Any]:
    members = (
        typing.get_args(ann)
        if typing.get_origin(ann) in (typing.Union, types.UnionType)
        else (ann,)
    )
    return {m for m in members if m in (str, int, float, bool)}


def is_text_key(key: str) -> bool:
    """A key whose only scalar type is text (``run_id``, ``kafka.bootstrap_servers``,
    ``data.train_files``): a number or date YAML read there is the text written."""
    return scalar_types(key) == {str}


def is_number_key(key: str) -> bool:
    """A key whose scalar types are numbers only (``rollout.n``, ``optim.lr``): a boolean
    there is a mistake, not 1 or 0."""
    found = scalar_types(key)
    return bool(found) and found <= {int, float}


def close_to_ours(key: str) -> str | None:
    """asyncrl's own key that ``key`` is very likely a misspelling of (a typo under a section
    whose other keys verl has and asyncrl refuses: ``optim.lrr``), or None."""
    close = difflib.get_close_matches(key, our_leaf_keys(), n=1, cutoff=0.9)
    if not close:
        return None
    # the whole dotted key is alike wherever the sections are: its last part must be too
    # (verl's fsdp_config.fsdp_size or .seed is no slip of fsdp_config.dtype)
    leaf, ours = key.rsplit(".", 1)[-1], close[0].rsplit(".", 1)[-1]
    return close[0] if difflib.SequenceMatcher(None, leaf, ours).ratio() >= 0.75 else None


def _nearest(key: str) -> str:
    candidates = [
        *our_leaf_keys(),
        *(k for k, r in verl_keys.VERL_KEYS.items() if r.kind == "alias"),
    ]
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if not close:  # a misspelt last part under the right section
        last = key.rsplit(".", 1)[-1]
        by_last = {c.rsplit(".", 1)[-1]: c for c in candidates}
        close = [by_last[m] for m in difflib.get_close_matches(last, list(by_last), n=1)]
    if close:
        return f"nearest valid key: {close[0]}"
    return "no similar key (docs/configuration.md lists them all)"
