"""Generates docs/configuration.md from the config models, so the reference never drifts.

Each field's docstring (the string under it in ops/config.py) is its description.
"""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import BaseModel

from asyncrl.ops.config import RunConfig


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return ""
    else:
        value = field.default
    return "`" + json.dumps(value) + "`"


def _type_name(ann: Any) -> str:
    if typing.get_origin(ann) is typing.Literal:
        return " or ".join(json.dumps(a) for a in typing.get_args(ann))
    if isinstance(ann, type):
        return ann.__name__
    return str(ann).replace("typing.", "")


def _rows(model: type[BaseModel], prefix: str) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(_rows(ann, key + "."))
            continue
        type_name = _type_name(ann)
        desc = " ".join((field.description or "").split())
        rows.append((key, type_name, _default(field), desc))
    return rows


def config_reference() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `ops/config.py` by `python -m asyncrl.ops.config_docs > docs/configuration.md`;",
        "a test fails when this file is out of date. Set any key in the run's YAML file or as a dotted",
        "override on the command line (`asyncrl run async_training.staleness_threshold=0.3`).",
        "Unknown keys and bad values stop the run at start-up with the key named.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for key, type_name, default, desc in _rows(RunConfig, ""):
        type_name = type_name.replace("|", "\\|")
        lines.append(f"| `{key}` | {type_name} | {default} | {desc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(config_reference(), end="")
