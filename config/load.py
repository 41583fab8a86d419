"""Loading a run's config: one YAML file plus overrides, in asyncrl's names or verl's.

1. The YAML file (default: the embedded demo config) is flattened to dotted keys. A top-level
   ``defaults:`` list and ``hydra:`` section (a verl file as it is) are dropped, with a note.
2. The overrides apply in order: ``key=value``, ``+key=value`` and ``++key=value`` set a key
   (Hydra's add and add-or-override), ``~key`` removes one.
3. ``${other.key}`` interpolations are resolved against the merged keys, then asyncrl's
   defaults; ``${oc.select:key,default}``, ``${oc.env:VAR}`` and relative ``${..key}`` too.
4. Each key is asyncrl's own (accepted), verl's name of one (aliased), one asyncrl ignores, or
   one it refuses (``config/verl_keys.py`` says which and why); anything else is an unknown key,
   reported with the nearest valid key.
5. verl's values are translated (``-1``: never), the aliases that convert units are computed
   from the final values they depend on, and ``RunConfig`` validates the tree.
6. Relative file paths (data files, the reward file, model.path, output_dir...) become
   absolute against the current directory (``config/paths.py``), so the saved config means
   the same files to every process of the run.

Every problem of steps 3-5 is reported at once, each line naming the key and where it came
from: the YAML file's path, or "command line".
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from asyncrl.config import verl_keys, verl_rules, verl_values
from asyncrl.config.base import DEFAULT_CONFIG, ConfigError
from asyncrl.config.keys import (
    _MISSING,
    _is_our_leaf,
    _is_our_section,
    _nearest,
    close_to_ours,
    default_of,
    is_number_key,
    is_text_key,
    leaf_of,
    our_key,
    scalar_types,
)
from asyncrl.config.overrides import (
    DELETE,
    _yaml_problem,
    load_yaml,
    parse_overrides,
    scalar_texts,
)
from asyncrl.config.paths import make_paths_absolute
from asyncrl.config.sections import RunConfig

COMMAND_LINE = "command line"
IGNORED_SECTIONS = {
    "defaults": "verl's Hydra defaults list is not read: keys the file does not set take "
    "asyncrl's defaults (docs/configuration.md), not verl's ppo_trainer.yaml",
    "hydra": "Hydra's own settings (searchpath, run directory) are not used by asyncrl",
}
ESTIMATOR = "algorithm.adv_estimator"
ESTIMATOR_NOTE = (
    f"{ESTIMATOR}: not set, where verl's default is gae (PPO with a critic): asyncrl runs "
    f"grpo, its only estimator (set {ESTIMATOR}=grpo to say so)"
)
"""The note of a verl config (one with verl's own keys) that leaves the estimator unset: verl
would train PPO with a critic, and asyncrl trained GRPO without a word."""
_OCTAL = re.compile(r"[-+]?0[0-7_]+")
"""YAML 1.1's octal, which a user writing 010 means as the decimal 10."""
_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


@dataclass
class Entry:
    key: str
    value: Any
    source: str
    """The YAML file's path, or "command line"."""
    text: str | None = None
    """What was written, where YAML read a scalar as a number, date or boolean (``20240101``)."""


@dataclass
class Decision:
    """What became of one key the user set."""

    key: str
    value: Any
    source: str
    kind: str
    """accepted, aliased, ignored, refused or unknown."""
    target: str | None = None
    """aliased: asyncrl's key."""
    result: Any = None
    """aliased: the value asyncrl's key gets."""
    why: str = ""
    overridden_by: str | None = None
    """aliased: the later key that set ``target`` to another value (this one is not applied)."""

    def where(self) -> str:
        return f"{self.key}={_show(self.value)} ({self.source})"


@dataclass
class LoadReport:
    decisions: list[Decision] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Sections dropped and verl values translated."""

    def of(self, kind: str) -> list[Decision]:
        return [d for d in self.decisions if d.kind == kind]

    def counts(self) -> dict[str, int]:
        kinds = ("accepted", "aliased", "ignored", "refused", "unknown")
        return {k: len(self.of(k)) for k in kinds}

    def alias_lines(self) -> list[str]:
        return [
            f"{d.where()} -> {d.target}={_show(d.result)}"
            + (f" (not applied: {d.overridden_by} is set later)" if d.overridden_by else "")
            for d in self.of("aliased")
        ]

    def ignored_lines(self) -> list[str]:
        return [f"{d.where()}: {d.why}" for d in self.of("ignored")]

    def warning(self) -> str | None:
        """One start-up warning naming every ignored key and every translated value, or None."""
        ignored, notes = self.ignored_lines(), self.notes
        if not ignored and not notes:
            return None
        lines = [f"  ignored {line}" for line in ignored] + [f"  {note}" for note in notes]
        return (
            f"config: {len(ignored)} key(s) ignored (no effect in asyncrl), {len(notes)} verl "
            "value(s) translated; see docs/configuration.md, verl's keys:\n" + "\n".join(lines)
        )


@dataclass
class Loaded:
    cfg: RunConfig | None
    report: LoadReport
    problems: list[str]

    def config(self) -> RunConfig:
        """The config, or ConfigError listing every problem."""
        if self.problems or self.cfg is None:
            raise ConfigError("invalid config:\n" + "\n".join(f"  {p}" for p in self.problems))
        return self.cfg


def _integral(text: str) -> Any:
    """``1e9`` as the int 1000000000 where it is a whole number; else ``text`` unchanged."""
    try:
        number = Decimal(text.strip())
    except InvalidOperation:
        return text
    return int(number) if number.is_finite() and number == number.to_integral_value() else text


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return (
        yaml.safe_dump(value, default_flow_style=True, width=1_000_000)
        .strip()
        .removesuffix("\n...")
    )


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


def _dropped_section(key: str) -> bool:
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


class _Unresolved(ValueError):
    pass


class _Resolver:
    def __init__(self, entries: dict[str, Entry]) -> None:
        self.entries = entries

    def value(self, key: str, value: Any, stack: tuple[str, ...] = ()) -> Any:
        if isinstance(value, str) and "${" in value:
            return self._string(key, value, stack)
        if isinstance(value, list):
            return [self.value(key, v, stack) for v in value]
        if isinstance(value, dict):
            return {k: self.value(f"{key}.{k}", v, stack) for k, v in value.items()}
        return value

    def _string(self, key: str, text: str, stack: tuple[str, ...]) -> Any:
        while "${" in text:
            match = _INTERPOLATION.search(text)
            if match is None:
                raise _Unresolved(f"unbalanced interpolation in {text!r}")
            found = self._expression(match.group(1).strip(), key, stack)
            if match.span() == (0, len(text)):
                return found  # the whole value: keeps its type
            text = text[: match.start()] + _show(found) + text[match.end() :]
        return text

    def _expression(self, expr: str, key: str, stack: tuple[str, ...]) -> Any:
        resolver, colon, args = expr.partition(":")
        if not colon:
            return self._lookup(expr, key, stack)
        name, _, default = (a.strip() for a in args.partition(","))
        if resolver == "oc.select":
            found = self._lookup(name, key, stack, required=False)
            return (yaml.safe_load(default) if default else None) if found is _MISSING else found
        if resolver == "oc.env":
            if name in os.environ:
                return os.environ[name]
            if default:
                return yaml.safe_load(default)
            raise _Unresolved(f"${{{expr}}}: environment variable {name} is not set")
        raise _Unresolved(
            f"${{{expr}}}: the resolver {resolver!r} is not supported by asyncrl (only "
            "${other.key}, ${oc.select:key,default} and ${oc.env:VAR}): write the value"
        )

    def _lookup(self, ref: str, key: str, stack: tuple[str, ...], required: bool = True) -> Any:
        if ref.startswith("."):  # relative: one dot is key's own section, each more one up
            dots = len(ref) - len(ref.lstrip("."))
            base = key.split(".")[:-dots]
            ref = ".".join([*base, ref.lstrip(".")])
        if ref in stack:
            raise _Unresolved(f"${{{ref}}} refers to itself: {' -> '.join([*stack, ref])}")
        if ref in self.entries:
            return self.value(ref, self.entries[ref].value, (*stack, ref))
        under = [k for k in self.entries if k.startswith(ref + ".")]
        if under:
            tree: dict[str, Any] = {}
            for k in under:
                _set_nested(tree, k[len(ref) + 1 :].split("."), self._lookup(k, key, stack))
            return tree
        found = default_of(ref)
        rule = verl_keys.lookup(ref)
        if found is _MISSING and rule is not None and rule.kind == "alias" and not rule.convert:
            found = default_of(rule.target or "")
        if found is _MISSING and required:
            raise _Unresolved(f"${{{ref}}} is not set (nor an asyncrl key with a default)")
        return found


def _set_nested(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = value


@dataclass
class _Assignment:
    value: Any
    order: int
    decision: Decision
    text: str | None = None
    """Entry.text of the value assigned, where it is the value written."""


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
    text = repr(value) if isinstance(value, str) else _show(value)
    return f" (got {text if len(text) <= 80 else text[:77] + '...'})"


def _format_validation(err: ValidationError, assigned: dict[str, _Assignment]) -> list[str]:
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


def _assignment(key: str, assigned: dict[str, _Assignment]) -> _Assignment | None:
    """What set ``key``: itself, or a key above it (a dict field set whole)."""
    return next((a for k, a in assigned.items() if key == k or key.startswith(k + ".")), None)


def _who(key: str, a: _Assignment) -> tuple[str, str]:
    """The key the user wrote for asyncrl's ``key``, and its source (with asyncrl's name of
    it, where the user wrote verl's)."""
    d = a.decision
    if d.kind == "aliased" and d.key != key and d.target is not None and key.startswith(d.target):
        return d.key, f"{d.source}; asyncrl's {key}"
    return key, d.source


def load(path: str | Path | None = None, overrides: list[str] | None = None) -> Loaded:
    """Steps 1-5 above: the config (or None) with every problem and what became of each key."""
    report = LoadReport()
    problems: list[str] = []
    merged = _Merged()
    for entry in _read_file(resolve_path(path)):
        merged.set(entry)
    for item, (key, value) in zip(overrides or [], parse_overrides(overrides or []), strict=True):
        if value is DELETE:
            if (
                our_key(key) is None
                and verl_keys.lookup(key) is None
                and not any(k == key or k.startswith(key + ".") for k in merged.entries)
            ):  # ~trainer.total_training_step: a misspelt key removes nothing
                problems.append(f"unknown key {key} ({COMMAND_LINE}, ~{key}): {_nearest(key)}")
            merged.remove(key)
            continue
        flat: list[Entry] = []
        _flatten(key, value, COMMAND_LINE, flat)
        texts = scalar_texts(item.partition("=")[2], key)
        for entry in flat:
            entry.text = texts.get(entry.key)
            merged.set(entry)

    # 3: interpolations, then dict values of verl keys flattened to their leaves
    resolver = _Resolver(merged.entries)
    entries: list[Entry] = []
    for e in merged.entries.values():
        if _dropped_section(e.key):
            entries.append(e)  # never resolved: Hydra's own ${now:...} and the like
            continue
        try:
            value = resolver.value(e.key, e.value)
        except _Unresolved as err:
            problems.append(f"{e.key} ({e.source}): interpolation {_show(e.value)}: {err}")
            continue
        flat = []
        _flatten(e.key, value, e.source, flat)
        if value is e.value and len(flat) == 1 and flat[0].key == e.key:
            flat[0].text = e.text  # no interpolation: what was written
        entries += flat
    raw = {e.key: e for e in entries}

    # 4: classify; asyncrl's keys and plain aliases assigned in order (the last one wins)
    assigned: dict[str, _Assignment] = {}
    later: list[tuple[int, Entry, verl_rules.VerlKey, Decision]] = []

    def assign(
        key: str, value: Any, order: int, decision: Decision, text: str | None = None
    ) -> None:
        old = assigned.get(key)
        if old is not None and old.decision is not decision and old.value != value:
            lost, won = (decision, old.decision) if old.order > order else (old.decision, decision)
            lost.overridden_by = won.where()
        if old is not None and old.order > order:
            return
        assigned.pop(key, None)
        assigned[key] = _Assignment(value, order, decision, text)

    for order, e in enumerate(entries):
        d = Decision(e.key, e.value, e.source, "accepted")
        report.decisions.append(d)
        if _dropped_section(e.key):
            d.kind, d.why = "ignored", IGNORED_SECTIONS[e.key.split(".", 1)[0]]
            continue
        if our_key(e.key) is not None:
            if e.value == "???":
                d.kind = "refused"
                problems.append(f"{e.key} ({e.source}): verl's ??? placeholder: set a value")
                continue
            assign(e.key, e.value, order, d, e.text)
            continue
        rule = verl_keys.lookup(e.key)
        if (rule is None or rule.kind == "refused") and e.value == {}:
            d.kind, d.why = "ignored", "an empty section sets nothing"
        elif (
            rule is not None
            and rule.kind == "refused"
            and e.value is None
            and (e.key in verl_keys.VERL_KEYS or not close_to_ours(e.key))
        ):  # verl's null: the option unused (data.tokenizer, model.custom_chat_template, ...)
            d.kind, d.why = "ignored", f"null: not used (another value is refused: {rule.why})"
        elif rule is None:
            d.kind = "unknown"
            problems.append(f"unknown key {e.key} ({e.source}): {_nearest(e.key)}")
        elif rule.kind == "alias":
            d.kind, d.target, d.why = "aliased", rule.target, rule.why
            if rule.convert is None:
                d.result = e.value
                assign(rule.target or "", e.value, order, d, e.text)
            else:
                later.append((order, e, rule, d))
        elif rule.kind == "ignored":
            d.kind, d.why = "ignored", rule.why
        elif rule.kind == "refused":
            d.kind, d.why = "refused", rule.why
            typo = None if e.key in verl_keys.VERL_KEYS else close_to_ours(e.key)
            if typo:  # a slip of asyncrl's own key first, verl's section after
                problems.append(
                    f"{d.where()}: no such key: did you mean {typo}? (verl's keys of this "
                    f"section are not supported by asyncrl: {rule.why})"
                )
            else:
                problems.append(f"{d.where()}: not supported by asyncrl: {rule.why}")
        else:
            later.append((order, e, rule, d))

    def get(key: str) -> Any:
        if key in assigned:
            return assigned[key].value
        if key in raw:
            return raw[key].value
        found = default_of(key)
        return None if found is _MISSING else found

    # 5: verl's values of asyncrl's keys, fixed behaviours, then the converting aliases
    for key, a in list(assigned.items()):
        if key not in verl_values.OUR_KEYS:
            continue
        _doc, convert = verl_values.OUR_KEYS[key]
        try:
            out = convert(a.value, get)
        except verl_rules.Refused as err:
            a.decision.kind, a.decision.why = "refused", str(err)
            problems.append(f"{a.decision.where()}: not supported by asyncrl: {err}")
            del assigned[key]
            continue
        if isinstance(out, verl_values.Converted):
            report.notes.append(f"{a.decision.where()}: {out.note}")
            if out.value is verl_values.DROP:
                del assigned[key]
            else:
                a.value = out.value
        else:
            a.value = out  # the same value, or its plain form (logger=console: [console])
    for order, e, rule, d in later:
        if rule.kind == "fixed":
            assert rule.ok is not None
            if rule.ok(e.value, get):
                d.kind, d.why = "ignored", f"{rule.why} (so this value changes nothing)"
            else:
                d.kind, d.why = "refused", f"{rule.why} (accepted: {rule.ok_text})"
                problems.append(f"{d.where()}: not supported by asyncrl: {d.why}")
            continue
        assert rule.convert is not None and rule.target
        try:
            d.result = rule.convert(e.value, get)
            if d.result is verl_rules.UNSET:
                d.kind, d.why = "ignored", f"null: {rule.target} keeps its value"
                continue
            assign(rule.target, d.result, order, d)
        except (TypeError, ValueError) as err:
            problems.append(f"{d.where()}: cannot convert to {rule.target}: {err}")

    verl_shaped = any(d.kind in ("aliased", "ignored", "refused") for d in report.decisions)
    if verl_shaped and ESTIMATOR not in raw:
        report.notes.append(ESTIMATOR_NOTE)

    tree: dict[str, Any] = {}
    for key, a in assigned.items():
        value = a.value
        if isinstance(value, int | float | date) and not isinstance(value, str):
            if is_text_key(key):  # run_id=20240101, kafka.bootstrap_servers=9092
                value = (
                    a.text if a.text is not None and a.value is a.decision.value else _show(value)
                )
            elif is_number_key(key) and a.text and _OCTAL.fullmatch(a.text):  # 010: 10, not 8
                value = int(a.text.replace("_", ""), 10)
            elif isinstance(value, bool) and is_number_key(key):  # rollout.n=true is not 1
                d = a.decision
                problems.append(
                    f"{d.key} ({d.source}): a number is needed, not a boolean (got {_show(d.value)})"
                )
                continue
        if isinstance(value, str) and is_number_key(key) and float not in scalar_types(key):
            value = _integral(value)  # 1e9 (YAML 1.1 reads it as text) for an int key
        _set_tree(tree, key, value)
    try:
        cfg: RunConfig | None = RunConfig.model_validate(tree)
    except ValidationError as err:
        cfg = None
        problems += _format_validation(err, assigned)
    if cfg is not None:  # 6: relative paths from the directory this command runs in
        make_paths_absolute(cfg, Path.cwd())
    return Loaded(cfg, report, problems)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load YAML (default: the embedded demo config), apply dotted overrides, validate.

    verl's key names and Hydra's override syntax are read too (config/load.py); keys with
    no effect in asyncrl are named in one warning. ConfigError lists every problem, each with
    its key and where it came from (the file, or "command line").
    """
    loaded = load(path, overrides)
    cfg = loaded.config()
    warning = loaded.report.warning()
    if warning:
        logging.getLogger("asyncrl.config").warning(warning)
    return cfg


def dump_config(cfg: RunConfig, path: Path) -> None:
    """Write the fully resolved config, so every process of a run reads the same values."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
