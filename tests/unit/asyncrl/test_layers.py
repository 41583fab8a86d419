"""The package's layers: imports flow one way (down), and no module imports itself round.

The layers, bottom to top, are written once here and drawn in docs/design.md ("Layers").
A module may import its own layer and the layers below; an upward import, or a circle of
imports (function-level imports included), fails this test with the offending chain.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[3]

LAYERS: list[tuple[str, list[str]]] = [
    ("wire formats", ["asyncrl.schemas"]),
    ("config", ["asyncrl.config"]),
    ("kafka client, telemetry", ["asyncrl.kafka", "asyncrl.telemetry"]),
    (
        "domain: tasks, models, weight transport",
        ["asyncrl.tasks", "asyncrl.models", "asyncrl.sync"],
    ),
    (
        "generation: engines, tools, agent loop, reward",
        [
            "asyncrl.producers.engines",
            "asyncrl.producers.tools",
            "asyncrl.producers.agent",
            "asyncrl.producers.reward",
            "asyncrl.producers.reward_server",
            "asyncrl.producers.budget",
        ],
    ),
    ("the demo policy's warm start", ["asyncrl.models.warm_start"]),
    ("roles: rollout worker, trainer", ["asyncrl.producers", "asyncrl.consumers"]),
    ("launching", ["asyncrl.launch"]),
    ("operator tools, benchmarks", ["asyncrl.ops", "asyncrl.bench"]),
    ("command line", ["asyncrl.cli", "asyncrl.__main__", "asyncrl"]),
]
"""Bottom to top. A module belongs to the layer of its longest matching prefix."""

FOLDERS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
    "setuptools"
]["package-dir"]
"""``{package: folder}``, as pyproject.toml maps them (a new folder is checked at once)."""


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            if package == "asyncrl" and any(
                name == p or name.startswith(p + ".") for p in FOLDERS if p != "asyncrl"
            ):
                continue
            found[name] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, anywhere in its file (TYPE_CHECKING included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    # `from pkg.mod import x` also names pkg.mod's parents only through their __init__:
    return {t for t in out if not (name.startswith(t + ".") and known[t].name == "__init__.py")}


def layer_of(name: str) -> int:
    best, index = "", -1
    for i, (_title, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > len(best):
                best, index = prefix, i
    assert index >= 0, f"{name} is in no layer: add it to LAYERS"
    return index


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{src} ({LAYERS[layer_of(src)][0]}) imports {dst} ({LAYERS[layer_of(dst)][0]})"
        for src, targets in edges.items()
        for dst in targets
        if layer_of(dst) > layer_of(src)
    )


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules, as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def test_every_module_is_in_a_layer():
    for name in modules():
        layer_of(name)


NOT_PACKAGES = {"tests", "tools", "docs", "docker", "build"}
"""Top-level folders that are not part of the package: the suite, scripts, docs, images."""


def test_every_top_level_folder_with_python_is_a_mapped_package_with_a_layer():
    """A new top-level folder must be in pyproject.toml's package-dir (so its modules are
    checked here) and its package must have a layer of its own in LAYERS."""
    folders = {
        p.name
        for p in ROOT.iterdir()
        if p.is_dir() and not p.name.startswith(".") and next(p.rglob("*.py"), None)
    }
    unmapped = folders - NOT_PACKAGES - set(FOLDERS.values())
    assert not unmapped, f"top-level folders not in pyproject.toml's package-dir: {unmapped}"
    prefixes = {prefix for _title, group in LAYERS for prefix in group}
    assert not set(FOLDERS) - prefixes, f"packages with no layer: {set(FOLDERS) - prefixes}"


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(graph()) == []


def test_no_import_circles():
    assert circles(graph()) == []


def test_the_checks_catch_a_planted_upward_import_and_a_circle():
    edges = graph()
    planted = {k: set(v) for k, v in edges.items()}
    planted["asyncrl.schemas.sample"].add("asyncrl.consumers.trainer")
    assert any("asyncrl.schemas.sample" in line for line in upward_imports(planted))
    assert any("asyncrl.schemas.sample" in group for group in circles(planted))


@pytest.mark.parametrize("source", ["from asyncrl.ops.inspect_log import read_records"])
def test_an_import_parsed_from_source_is_seen(tmp_path, source):
    path = tmp_path / "mod.py"
    path.write_text(f"def f():\n    {source}\n")
    known = {"asyncrl.ops.inspect_log": path, "asyncrl.producers.recovery": path}
    assert imports_of("asyncrl.producers.recovery", path, known) == {"asyncrl.ops.inspect_log"}
