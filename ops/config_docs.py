"""Generates docs/configuration.md from the config models, so the reference never drifts.

Each field's docstring (the string under it in its section's module, config/<section>.py) is its
description.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from pydantic import BaseModel

from asyncrl.config import RunConfig


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return ""
    else:
        value = field.default
    return "`" + json.dumps(value) + "`"


def _type_name(ann: Any) -> str:
    """A key's type as a user reads it: ``dict[str, int]``, not the constraints pydantic
    carries in ``Annotated`` (they are said in the description)."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        if any(typing.get_origin(a) is typing.Literal for a in args):  # Literal[...] | None
            return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
        return " | ".join("None" if a is type(None) else _type_name(a) for a in args)
    if origin is not None and args:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type_name(a) for a in args)}]"
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


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def verl_reference() -> str:
    """The section on verl's names: aliases, ignored, fixed and refused keys (config/verl_keys.py)."""
    from asyncrl.config import verl_keys, verl_rules, verl_values

    by_kind: dict[str, list[tuple[str, verl_rules.VerlKey]]] = {}
    for key, rule in verl_keys.VERL_KEYS.items():
        by_kind.setdefault(rule.kind, []).append((key, rule))
    lines = [
        "",
        "## verl's keys",
        "",
        "A verl launch script's overrides, or a verl YAML file as it is, load too "
        "(`config/verl_keys.py` holds the tables below; `asyncrl run --dry-run` shows what became "
        "of each key). Each key that is not one of the above is:",
        "",
        "* an alias: verl's name of one of asyncrl's settings; the value goes to asyncrl's key "
        "(converted where verl counts differently), and `runs/<run_id>/config.yaml` holds "
        "asyncrl's names;",
        "* ignored: it changes nothing asyncrl computes; a warning at start-up names each one;",
        "* fixed: asyncrl always behaves one way; the value meaning that is ignored (with the "
        "warning), any other is refused;",
        "* refused: the run stops at start-up with `not supported by asyncrl:` and the reason;",
        "* anything else: `unknown key <key> (<file or command line>): nearest valid key: ...`.",
        "",
        "A key `prefix.*` covers its whole section unless a longer entry names the key; a key "
        "ending in `_target_` (Hydra's class to build) is ignored, and so is an empty section "
        "(`{}`) and a refused key set to `null` (verl's value for an option not used: "
        "`data.tokenizer`, `actor_rollout_ref.model.custom_chat_template`, ...). Hydra's syntax is read: `+key=value` and `++key=value` set a key like "
        "`key=value`, `~key` removes one; a file's top-level `defaults:` list and `hydra:` "
        "section are ignored (keys the file does not set take asyncrl's defaults, not verl's "
        "`ppo_trainer.yaml`). `${...}` interpolations are OmegaConf's, as in verl: `${other.key}`, "
        "relative `${..key}` and OmegaConf's `oc.*` resolvers (`${oc.select:key,default}`, "
        "`${oc.env:VAR}`, ...) resolve against the merged keys over asyncrl's defaults; any "
        "other resolver is refused naming the key.",
    ]
    rules = by_kind.get
    lines += _table(
        "Aliases",
        ["verl key", "asyncrl key", "how"],
        [(f"`{k}`", f"`{r.target}`", _cell(r.why)) for k, r in rules("alias", [])],
    )
    lines += _table(
        "verl's values of asyncrl's keys",
        ["key", "verl's value"],
        [(f"`{k}`", _cell(doc)) for k, (doc, _convert) in verl_values.OUR_KEYS.items()],
    )
    lines += _table(
        "Ignored (a warning at start-up names each)",
        ["verl key", "why it changes nothing"],
        [(f"`{k}`", _cell(r.why)) for k, r in rules("ignored", [])],
    )
    lines += _table(
        "Fixed: ignored with the value shown, refused with any other",
        ["verl key", "ignored when", "what asyncrl does"],
        [(f"`{k}`", _cell(r.ok_text), _cell(r.why)) for k, r in rules("fixed", [])],
    )
    lines += _table(
        "Refused: not supported by asyncrl",
        ["verl key", "why"],
        [(f"`{k}`", _cell(r.why)) for k, r in rules("refused", [])],
    )
    return "\n".join(lines) + "\n"


def _demo_settings(quote: str) -> str:
    """The keys the demo's file sets to other values than their defaults, ``key: value``."""
    import yaml

    from asyncrl.config.base import DEFAULT_CONFIG
    from asyncrl.config.keys import default_of
    from asyncrl.config.read import _flatten
    from asyncrl.config.report import Entry

    entries: list[Entry] = []
    _flatten("", yaml.safe_load(DEFAULT_CONFIG.read_text()), str(DEFAULT_CONFIG), entries)
    changed = [e for e in entries if default_of(e.key) != e.value]
    return ", ".join(f"{quote}{e.key}: {json.dumps(e.value)}{quote}" for e in changed)


def config_reference() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the config models (`config/`) by `python -m asyncrl.ops.config_docs > docs/configuration.md`;",
        "a test fails when this file is out of date. Set any key in the run's YAML file or as a dotted",
        "override on the command line (`asyncrl run async_training.staleness_threshold=0.3`).",
        "Unknown keys and bad values stop the run at start-up with the key named; verl's own",
        "names load too (see [verl's keys](#verls-keys) below).",
        "",
        "The defaults below are what a key takes when the run's YAML file does not set it. With no",
        "`--config`, the run's file is the demo's, `asyncrl/configs/default.yaml`, which sets",
        f"{_demo_settings('`')}; a file of your own starts from the defaults below, not from the",
        "demo's file.",
        "",
        "**Relative paths** (`output_dir`, `data.train_files`/`val_files`, "
        "`custom_reward_function.path`, `actor_rollout_ref.rollout.multi_turn.tool_config_path`, "
        "`actor_rollout_ref.model.path` where it names something there rather than a Hub id, "
        "`actor_rollout_ref.model.cache_dir`, the `kafka.security.ssl_*_location` files) are "
        "taken from the directory the command that first loads the config runs in, whether the "
        "YAML file or the command line wrote them, and made absolute there (`config/paths.py`): "
        "`runs/<run_id>/config.yaml` holds absolute paths, so `asyncrl train`, `asyncrl "
        "rollout`, the compose services and `asyncrl replay` read the same files from any "
        "directory. `~` is expanded; a URL (`hdfs://...`) is kept as written.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for key, type_name, default, desc in _rows(RunConfig, ""):
        type_name = type_name.replace("|", "\\|")
        lines.append(f"| `{key}` | {type_name} | {default} | {desc} |")
    return "\n".join(lines) + "\n" + verl_reference()


COMMON_KEYS = (
    "run_id",
    "output_dir",
    "kafka.bootstrap_servers",
    "data.task",
    "data.train_files",
    "data.val_files",
    "actor_rollout_ref.model.path",
    "custom_reward_function.path",
    "trainer.total_training_steps",
    "trainer.device",
    "trainer.save_freq",
    "trainer.test_freq",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.num_workers",
    "async_training.staleness_threshold",
    "async_training.trigger_parameter_sync_step",
    "async_training.partial_rollout",
)
"""The keys a subcommand's --help shows; ``--help-keys`` lists all of them (158 once: a
481-line --help buried the dozen a first run sets)."""


def config_help(width: int = 100, prefix: str | None = None) -> str:
    """Config keys with their types, defaults and docstrings, for the help: the common ones
    (``prefix`` None), or every key under ``prefix`` ("" for all). ValueError: none there."""
    import textwrap

    rows = _rows(RunConfig, "")
    if prefix is None:
        chosen = [r for r in rows if r[0] in COMMON_KEYS]
        title = [
            f"common config keys ({len(chosen)} of {len(rows)}: `--help-keys` lists every one,",
            "`--help-keys kafka` those under kafka; docs/configuration.md has them as a table).",
        ]
    else:
        chosen = [r for r in rows if not prefix or r[0] == prefix or r[0].startswith(f"{prefix}.")]
        if not chosen:
            # A prefix is whole dotted parts: `async_training.staleness` or `staleness_threshold`
            # lists nothing, so the keys holding the text are named (what the user looked for).
            holding = [r[0] for r in rows if prefix.lower() in r[0].lower()]
            sections = sorted({r[0].split(".")[0] for r in rows})
            raise ValueError(
                f"no config key is or is under {prefix!r}; "
                + (
                    f"keys containing it: {', '.join(holding[:12])}"
                    + (f" (and {len(holding) - 12} more)" if len(holding) > 12 else "")
                    if holding
                    else f"sections: {', '.join(sections)}"
                )
            )
        title = [f"config keys{f' under {prefix}' if prefix else ''} ({len(chosen)})."]
    lines = [
        *title,
        "Set them in --config FILE or as key.path=value; verl's names load too. A default is",
        "what a key takes when the --config file does not set it; with no --config the file is",
        "the demo's (asyncrl/configs/default.yaml), which sets:",
        *textwrap.wrap(_demo_settings(""), width, initial_indent="  ", subsequent_indent="  "),
    ]
    for key, type_name, default, desc in chosen:
        head = f"  {key}  [{type_name}" + (f", default {default.strip('`')}]" if default else "]")
        lines.append(head)
        lines += textwrap.wrap(desc, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines) + "\n"


def _table(title: str, header: list[str], rows: list[tuple[str, ...]]) -> list[str]:
    """One subsection of the verl key tables, as markdown lines (a blank line before it)."""
    out = ["", f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(row) + " |" for row in rows]


if __name__ == "__main__":
    print(config_reference(), end="")
