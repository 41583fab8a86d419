"""Dotted command-line overrides (``a.b.c=value``), with Hydra's ``+``/``++``/``~`` prefixes."""

from __future__ import annotations

from typing import Any

import yaml

from asyncrl.config.base import ConfigError

DELETE = object()
"""parse_overrides' value for Hydra's ``~key``: remove the key."""


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """Parse ``a.b.c=value`` strings; values are read as YAML scalars (0.5, true, null, text).

    Hydra's syntax as verl's launch scripts use it: ``+key=value`` (add) and ``++key=value``
    (add or override) set the key like ``key=value``; ``~key`` removes it (value DELETE).
    """
    parsed: list[tuple[str, Any]] = []
    for item in overrides:
        if item.startswith("~"):
            key = item[1:].partition("=")[0].strip()
            if not key:
                raise ConfigError(f"override {item!r} must look like ~key.path")
            parsed.append((key, DELETE))
            continue
        key, sep, raw = item.removeprefix("++").removeprefix("+").partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key.path=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: {_yaml_problem(err)}") from None
        parsed.append((key.strip(), value))
    return parsed


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line: where the YAML broke (1-based line and column) and what is wrong there."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"YAML syntax error{where}: {problem}"
