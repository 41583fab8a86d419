"""Steps 1-2 of loading: the YAML file and the overrides, merged into dotted keys in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from asyncrl.config import verl_keys
from asyncrl.config.base import DEFAULT_CONFIG, ConfigError
from asyncrl.config.keys import _is_our_leaf, _is_our_section, _nearest, our_key
from asyncrl.config.overrides import (
    DELETE,
    _yaml_problem,
    load_yaml,
    parse_overrides,
    scalar_texts,
)
from asyncrl.config.report import Entry

COMMAND_LINE = "command line"
IGNORED_SECTIONS = {
    "defaults": "verl's Hydra defaults list is not read: keys the file does not set take "
    "asyncrl's defaults (docs/configuration.md), not verl's ppo_trainer.yaml",
    "hydra": "Hydra's own settings (searchpath, run directory) are not used by asyncrl",
}


def _flatten(prefix: str, value: Any, source: str, out: list[Entry]) -> None:
    if isinstance(value, dict) and (value or not prefix) and not _is_our_leaf(prefix):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, source, out)
    elif (value is None or value == {}) and _is_our_section(prefix):
        return  # an empty section of ours: its defaults
    else:
        out.append(Entry(prefix, value, source))


class _Merged:
    """Dotted keys in the order they were last set; a key replaces what was under or over it."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}

    def remove(self, key: str) -> None:
        for k in [k for k in self.entries if k == key or k.startswith(key + ".")]:
            del self.entries[k]

    def set(self, entry: Entry) -> None:
        self.remove(entry.key)
        for k in [k for k in self.entries if entry.key.startswith(k + ".")]:
            old = self.entries.pop(k)
            if isinstance(old.value, dict):  # a key inside a dict field (kafka.extra.<name>)
                entry = Entry(k, {**old.value, entry.key[len(k) + 1 :]: entry.value}, entry.source)
            # else: a scalar that now becomes a section
        self.entries[entry.key] = entry


def _read_file(path: Path) -> list[Entry]:
    try:
        content = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ConfigError(f"{path}: a directory, not a config file") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not text (UTF-8): byte {err.start} is {err.object[err.start]:#x}"
        ) from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        tree = load_yaml(content) or {}
        texts = scalar_texts(content)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: {_yaml_problem(err)}") from None
    except ValueError as err:
        raise ConfigError(f"{path}: {err}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    out: list[Entry] = []
    _flatten("", tree, str(path), out)
    for e in out:
        e.text = texts.get(e.key)
    return out


def dropped_section(key: str) -> bool:
    """A verl file's top-level ``defaults:`` list or ``hydra:`` section."""
    return key.split(".", 1)[0] in IGNORED_SECTIONS and our_key(key) is None


def resolve_path(path: str | Path | None) -> Path:
    """The config file: a path, a shipped config by name (``calculator``), or the demo's."""
    path = Path(path) if path else DEFAULT_CONFIG
    shipped = DEFAULT_CONFIG.parent / f"{path}.yaml"
    if not path.exists() and path.suffix == "" and shipped.exists():
        path = shipped
    if not path.exists():
        names = ", ".join(sorted(p.stem for p in DEFAULT_CONFIG.parent.glob("*.yaml")))
        raise ConfigError(f"config file not found: {path} (shipped configs: {names})")
    return path


def read(path: str | Path | None, overrides: list[str], problems: list[str]) -> list[Entry]:
    """The file's keys, then each override in order (``~key`` removes one), as dotted entries;
    ``~key`` of a key nobody knows is a problem (a misspelt key removes nothing)."""
    merged = _Merged()
    for entry in _read_file(resolve_path(path)):
        merged.set(entry)
    for item, (key, value) in zip(overrides, parse_overrides(overrides), strict=True):
        if value is DELETE:
            if (
                our_key(key) is None
                and verl_keys.lookup(key) is None
                and not any(k == key or k.startswith(key + ".") for k in merged.entries)
            ):
                problems.append(f"unknown key {key} ({COMMAND_LINE}, ~{key}): {_nearest(key)}")
            merged.remove(key)
            continue
        flat: list[Entry] = []
        _flatten(key, value, COMMAND_LINE, flat)
        texts = scalar_texts(item.partition("=")[2], key)
        for entry in flat:
            entry.text = texts.get(entry.key)
            merged.set(entry)
    return list(merged.entries.values())
