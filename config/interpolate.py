"""Step 3 of loading: ``${...}`` interpolations, resolved by OmegaConf as verl's Hydra resolves them.

OmegaConf resolves against asyncrl's defaults with the keys the user set over them (and, at
each plain alias of verl's, its asyncrl key's default), so ``${other.key}`` finds a key the
file leaves to its default, as verl's finds one of ``ppo_trainer.yaml``. What OmegaConf reads
is what verl reads: ``${other.key}``, relative ``${.sibling}`` and ``${..key}``, and its
``oc.*`` resolvers (``${oc.select:key,default}``, ``${oc.env:VAR}``, ...); a value that is one
interpolation keeps its type, one inside text is joined as text. Another resolver (Hydra's
``now``, a script's own) is a problem naming the key, and so is a key that is not set, a
circle, or a malformed ``${``. The ``defaults:`` and ``hydra:`` sections a verl file carries
are not resolved, nor can a key refer to them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from asyncrl.config import verl_keys
from asyncrl.config.keys import _MISSING, default_of, our_leaf_keys
from asyncrl.config.read import _flatten, dropped_section
from asyncrl.config.report import Entry, show

if TYPE_CHECKING:
    from omegaconf import DictConfig

_FLAGS = {"allow_objects": True}
"""Values OmegaConf does not type (a date YAML read) are kept as they are."""


def _interpolates(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, list):
        return any(_interpolates(v) for v in value)
    if isinstance(value, dict):
        return any(_interpolates(v) for v in value.values())
    return False


def _put(tree: dict[str, Any], key: str, value: Any, replace: bool = True) -> None:
    """Set dotted ``key`` in ``tree``; a value on the way becomes a section. With ``replace``
    False, nothing changes where ``key`` or a value above it is already there."""
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            if child is not None and not replace:
                return
            child = node[part] = {}
        node = child
    if replace or parts[-1] not in node:
        node[parts[-1]] = value


def _defaults() -> dict[str, Any]:
    """asyncrl's defaults as a tree, with each plain verl alias at its asyncrl key's default."""
    tree: dict[str, Any] = {}
    for key in our_leaf_keys():
        _put(tree, key, default_of(key))
    for key, rule in verl_keys.VERL_KEYS.items():
        if rule.kind == "alias" and rule.convert is None and rule.target and "*" not in key:
            found = default_of(rule.target)
            if found is not _MISSING:
                _put(tree, key, found, replace=False)
    return tree


def _why(err: Exception) -> str:
    """OmegaConf's error as one line, in the words of the key the user wrote."""
    from omegaconf.errors import InterpolationKeyError, UnsupportedInterpolationType

    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if isinstance(err, UnsupportedInterpolationType):
        name = text.rsplit(" ", 1)[-1]
        return (
            f"the resolver {name!r} is not supported by asyncrl (only ${{other.key}} and "
            "OmegaConf's oc.* resolvers, such as ${oc.select:key,default} and ${oc.env:VAR}): "
            "write the value"
        )
    if isinstance(err, InterpolationKeyError):
        found = re.search(r"Interpolation key '(.*)' not found", text)
        ref = found.group(1) if found else text
        return f"${{{ref}}} is not set (nor an asyncrl key with a default)"
    if "Recursive interpolation detected" in text:
        return "it refers to itself, directly or through other keys"
    return text


def _resolved(root: DictConfig, key: str) -> Any:
    """The value at dotted ``key`` of ``root``, its interpolations resolved, as plain Python."""
    from omegaconf import OmegaConf

    parts = key.split(".")
    node: Any = root
    for part in parts[:-1]:
        node = node[part]
    value = node[parts[-1]]
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    return value


def resolve(entries: list[Entry], problems: list[str]) -> list[Entry]:
    """The entries with their interpolations resolved, a dict value a verl key got flattened
    to its leaves; each entry that does not resolve is left out, with a problem naming it."""
    if not any(_interpolates(e.value) for e in entries if not dropped_section(e.key)):
        return entries  # nothing to resolve: no tree to build (nor OmegaConf to import)
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    tree = _defaults()
    bad: set[str] = set()
    for e in entries:
        if dropped_section(e.key):
            continue
        if isinstance(e.value, dict | list) or _interpolates(e.value):
            try:  # OmegaConf parses every ${ as it builds a tree: one at a time, to name it
                OmegaConf.create({"v": e.value}, flags=_FLAGS)
            except OmegaConfBaseException as err:
                if _interpolates(e.value):
                    bad.add(e.key)
                    problems.append(
                        f"{e.key} ({e.source}): interpolation {show(e.value)}: {_why(err)}"
                    )
                continue
        _put(tree, e.key, e.value)
    try:
        root = OmegaConf.create(tree, flags=_FLAGS)
    except OmegaConfBaseException as err:  # a value OmegaConf cannot hold, outside the checks
        root, why = None, _why(err)
    out: list[Entry] = []
    for e in entries:
        if e.key in bad:
            continue
        if dropped_section(e.key) or not _interpolates(e.value):
            out.append(e)  # as written (a dropped section's ${now:...} too), with its text
            continue
        try:
            if root is None:
                raise ValueError(why)
            value = _resolved(root, e.key)
        except (OmegaConfBaseException, ValueError) as err:
            problems.append(f"{e.key} ({e.source}): interpolation {show(e.value)}: {_why(err)}")
            continue
        _flatten(e.key, value, e.source, out)
    return out
