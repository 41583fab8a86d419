"""Type-check the package with mypy (`make lint` runs this).

pyproject.toml's `[tool.setuptools] package-dir` maps top-level folders to subpackages
(`kafka/` is `asyncrl.kafka`, and so on), which mypy cannot follow. This script builds the
package as mypy should see it, a tree of symlinks under build/typecheck/ (one per entry of
`asyncrl/`, one per mapped folder, named by its subpackage), runs `mypy -p asyncrl` there with
the settings in pyproject.toml's `[tool.mypy]`, and reports errors by their source paths.

    .venv/bin/python tools/typecheck.py [extra mypy arguments]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "typecheck"


def package_dirs() -> dict[str, str]:
    """`{package: folder}` from pyproject.toml, parents before their subpackages."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    return dict(sorted(mapping.items(), key=lambda item: item[0].count(".")))


def build_tree(mapping: dict[str, str]) -> dict[str, str]:
    """Build the symlink tree under TREE; returns `{tree path prefix: source path prefix}`."""
    prefixes: dict[str, str] = {}
    for package in {name.split(".")[0] for name in mapping}:
        shutil.rmtree(TREE / package, ignore_errors=True)
    for package, folder in mapping.items():
        source = ROOT / folder
        target = TREE.joinpath(*package.split("."))
        prefixes[f"{target.relative_to(TREE).as_posix()}/"] = f"{Path(folder).as_posix()}/"
        if "." not in package:  # a top-level package: a real folder, its entries linked
            target.mkdir(parents=True)
            for entry in sorted(source.iterdir()):
                if entry.name != "__pycache__":
                    (target / entry.name).symlink_to(entry)
            continue
        if target.parent.is_symlink() or not target.parent.is_dir():
            sys.exit(
                f"typecheck: cannot map {package} -> {folder}: its parent is not a mapped package"
            )
        if target.exists() or target.is_symlink():
            sys.exit(f"typecheck: {package} -> {folder} clashes with {target}")
        target.symlink_to(source, target_is_directory=True)
    return prefixes


def to_source_path(line: str, prefixes: dict[str, str]) -> str:
    """Rewrite a mypy line's `asyncrl/kafka/x.py:...` to `kafka/x.py:...`."""
    for tree_prefix in sorted(prefixes, key=len, reverse=True):
        if line.startswith(tree_prefix):
            return prefixes[tree_prefix] + line[len(tree_prefix) :]
    return line


def main(argv: list[str]) -> int:
    mapping = package_dirs()
    prefixes = build_tree(mapping)
    roots = sorted({name.split(".")[0] for name in mapping})
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    for root in roots:
        command += ["-p", root]
    done = subprocess.run([*command, *argv], cwd=TREE, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        print(to_source_path(line, prefixes))
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
