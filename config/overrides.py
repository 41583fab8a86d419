"""Dotted command-line overrides (``a.b.c=value``), with Hydra's ``+``/``++``/``~`` prefixes."""

from __future__ import annotations

from typing import Any

import yaml

from asyncrl.config.base import ConfigError

DELETE = object()
"""parse_overrides' value for Hydra's ``~key``: remove the key."""


def override_key(item: str) -> str:
    """The key an override sets (``a.b=1``, Hydra's ``+a.b=1`` and ``++a.b=1``) or removes
    (``~a.b``), as :func:`parse_overrides` reads it: what a command asks to tell whether the
    command line names a key."""
    if item.startswith("~"):
        return item[1:].partition("=")[0].strip()
    return item.removeprefix("++").removeprefix("+").partition("=")[0].strip()


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """Parse ``a.b.c=value`` strings; values are read as YAML scalars (0.5, true, null, text).

    Hydra's syntax as verl's launch scripts use it: ``+key=value`` (add) and ``++key=value``
    (add or override) set the key like ``key=value``; ``~key`` removes it (value DELETE).
    """
    parsed: list[tuple[str, Any]] = []
    for item in overrides:
        key = override_key(item)
        if item.startswith("~"):
            if not key:
                raise ConfigError(f"override {item!r} must look like ~key.path")
            parsed.append((key, DELETE))
            continue
        _, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        try:
            value = load_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: {_yaml_problem(err)}") from None
        except ValueError as err:
            raise ConfigError(f"override {item!r}: {err}") from None
        parsed.append((key, value))
    return parsed


def _duplicate_key(node: yaml.Node | None, prefix: str = "") -> str | None:
    """The first key a YAML mapping repeats (dotted, with both lines), or None: PyYAML keeps
    the last silently, so a repeated section throws the first one's keys away."""
    todo: list[tuple[yaml.Node, str]] = [(node, prefix)] if node is not None else []
    seen_nodes: set[int] = set()
    while todo:
        node, prefix = todo.pop()
        if id(node) in seen_nodes:  # an alias of an anchor already walked
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                    key_node, yaml.ScalarNode
                ):
                    todo.append((value_node, prefix))
                    continue
                key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
                line = key_node.start_mark.line + 1
                if key_node.value in first:
                    return f"duplicate key {key} at line {line} (first at line {first[key_node.value]})"
                first[key_node.value] = line
                todo.append((value_node, key))
        elif isinstance(node, yaml.SequenceNode):
            todo += [(item, f"{prefix}[{i}]") for i, item in enumerate(node.value)]
    return None


def scalar_texts(text: str, prefix: str = "") -> dict[str, str]:
    """The text of each plain scalar YAML reads as something else than text (``20240101``,
    ``2024-01-01``, ``010``, ``true``), by dotted key under ``prefix``: a text key given one
    takes what was written, not the number, date or boolean YAML made of it."""
    out: dict[str, str] = {}
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    todo: list[tuple[yaml.Node, str]] = [(root, prefix)] if root is not None else []
    while todo:
        node, key = todo.pop()
        if isinstance(node, yaml.ScalarNode):
            if node.style is None and node.tag != "tag:yaml.org,2002:str":
                out[key] = node.value
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != (
                    "tag:yaml.org,2002:merge"
                ):
                    todo.append((value_node, f"{key}.{key_node.value}" if key else key_node.value))
    return out


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, refusing a repeated key (ValueError naming it and its lines)."""
    problem = _duplicate_key(yaml.compose(text, Loader=yaml.SafeLoader))
    if problem:
        raise ValueError(f"{problem}: keep one (YAML would keep the last silently)")
    return yaml.safe_load(text)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line: where the YAML broke (1-based line and column) and what is wrong there."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"YAML syntax error{where}: {problem}"
