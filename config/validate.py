"""Step 6 of loading: asyncrl's keys as a tree, validated by ``RunConfig``; each error a line
naming the key the user wrote and where it came from."""

from __future__ import annotations

import re
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import ValidationError

from asyncrl.config.keys import is_number_key, is_text_key, leaf_of, our_key, scalar_types
from asyncrl.config.report import show
from asyncrl.config.sections import RunConfig
from asyncrl.config.translate import Assignment

_OCTAL = re.compile(r"[-+]?0[0-7_]+")
"""YAML 1.1's octal, which a user writing 010 means as the decimal 10."""


def _integral(text: str) -> Any:
    """``1e9`` as the int 1000000000 where it is a whole number; else ``text`` unchanged."""
    try:
        number = Decimal(text.strip())
    except InvalidOperation:
        return text
    return int(number) if number.is_finite() and number == number.to_integral_value() else text


def _set_tree(tree: dict[str, Any], key: str, value: Any) -> None:
    field_key, rest = our_key(key) or (key, None)
    parts = field_key.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    if rest is None:
        node[parts[-1]] = value
    else:
        inner = node.get(parts[-1])
        node[parts[-1]] = {**(inner if isinstance(inner, dict) else {}), rest: value}


def _shown(value: Any) -> str:
    """`` (got value)``, cut to 80 characters."""
    text = repr(value) if isinstance(value, str) else show(value)
    return f" (got {text if len(text) <= 80 else text[:77] + '...'})"


def _format_validation(err: ValidationError, assigned: dict[str, Assignment]) -> list[str]:
    """One line per key: the key the user wrote (a verl alias with asyncrl's key beside it),
    where it came from, what is wrong and the value. A value a union refused is one line
    naming its types; a check across keys names the keys it mentions and where each was set."""
    lines: list[str] = []
    unions: dict[str, list[str]] = {}  # key: the types of a union, each refused
    for e in err.errors():
        key, below = leaf_of(tuple(e["loc"]))
        if below and isinstance(below[0], str):  # pydantic's try of one member of a union
            if key not in unions:
                unions[key] = []
                lines.append(key)  # replaced below, in place
            if below[0] not in unions[key]:
                unions[key].append(below[0])
            continue
        key = ".".join([key, *map(str, below)]) if below else key
        got = e.get("input")
        msg = e["msg"].removeprefix("Value error, ")  # our validators' own sentences
        a = _assignment(key, assigned)
        if a is not None:
            who, where = _who(key, a)
            if a.decision.kind == "aliased" and key in assigned:
                got = a.decision.value  # what was written, before its conversion
            shown = _shown(got) if isinstance(got, str | int | float | bool | date) else ""
            lines.append(f"{who} ({where}): {msg}{shown}")
            continue
        shown = _shown(got) if isinstance(got, str | int | float | bool | date) else ""
        mentioned = sorted(
            (m.start(), k)
            for k in assigned
            if (m := re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", msg)) is not None
        )
        if not mentioned:
            lines.append(f"{key or '(config)'}: {msg}{shown}")
            continue
        by = ", ".join(
            f"{who} ({where})" for who, where in (_who(k, assigned[k]) for _, k in mentioned)
        )
        head = "" if mentioned[0][0] == 0 else f"{key or '(config)'}: "
        lines.append(f"{head}{msg}{shown}; set by {by}")
    for key, types in unions.items():
        a = _assignment(key, assigned)
        who, where = _who(key, a) if a is not None else (key, "")
        shown = _shown(a.decision.value) if a is not None else ""
        expected = f"{', '.join(types[:-1])} or {types[-1]}" if len(types) > 1 else types[0]
        lines[lines.index(key)] = (
            f"{who}{f' ({where})' if where else ''}: Input should be {expected}{shown}"
        )
    return lines


def _assignment(key: str, assigned: dict[str, Assignment]) -> Assignment | None:
    """What set ``key``: itself, or a key above it (a dict field set whole)."""
    return next((a for k, a in assigned.items() if key == k or key.startswith(k + ".")), None)


def _who(key: str, a: Assignment) -> tuple[str, str]:
    """The key the user wrote for asyncrl's ``key``, and its source (with asyncrl's name of
    it, where the user wrote verl's)."""
    d = a.decision
    if d.kind == "aliased" and d.key != key and d.target is not None and key.startswith(d.target):
        return d.key, f"{d.source}; asyncrl's {key}"
    return key, d.source


def _tree(assigned: dict[str, Assignment], problems: list[str]) -> dict[str, Any]:
    """asyncrl's keys nested, each scalar read as its key means it: a number or date YAML
    read for a text key is the text written, 010 is ten, 1e9 an int; a boolean for a number
    key is a problem."""
    tree: dict[str, Any] = {}
    for key, a in assigned.items():
        value = a.value
        if isinstance(value, int | float | date) and not isinstance(value, str):
            if is_text_key(key):  # run_id=20240101, kafka.bootstrap_servers=9092
                value = (
                    a.text if a.text is not None and a.value is a.decision.value else show(value)
                )
            elif is_number_key(key) and a.text and _OCTAL.fullmatch(a.text):  # 010: 10, not 8
                value = int(a.text.replace("_", ""), 10)
            elif isinstance(value, bool) and is_number_key(key):  # rollout.n=true is not 1
                d = a.decision
                problems.append(
                    f"{d.key} ({d.source}): a number is needed, not a boolean (got {show(d.value)})"
                )
                continue
        if isinstance(value, str) and is_number_key(key) and float not in scalar_types(key):
            value = _integral(value)  # 1e9 (YAML 1.1 reads it as text) for an int key
        _set_tree(tree, key, value)
    return tree


def validate(assigned: dict[str, Assignment], problems: list[str]) -> RunConfig | None:
    """The config, or None with a line per problem added to ``problems``."""
    tree = _tree(assigned, problems)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as err:
        problems += _format_validation(err, assigned)
        return None
