"""The house's guards, run by `make lint`: module sizes, and the code's references into docs/.

1. Size. No source module (a ``.py`` file under a folder pyproject.toml's package-dir maps;
   tests/ and tools/ are not source) is longer than ``MAX_LINES``; the modules in ``LIMITS``
   have a tighter limit of their own. One idea per module: a file past its limit is a sign it
   holds two.
2. Doc references. A docstring or comment that cites ``docs/<file>.md`` names a file that
   exists; a quoted section after it (``docs/design.md, "Layers"``, ``docs/design.md
   ("Processes")``, ``docs/tuning.md's "Keys"``, ``docs/design.md section "Topics"``) names a
   heading of that file, or the bold lead of one of its paragraphs, by its first words. A
   numbered section (``section 4``) and ``DESIGN.md``, a file this repository does not have,
   are errors: the design is ``docs/design.md`` and its sections have names, not numbers.

    .venv/bin/python tools/house_checks.py

Prints one line per problem and exits 1 if there is any.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]

MAX_LINES = 500
"""The hard limit on a source module's length, in lines."""

LIMITS: dict[str, int] = {
    "consumers/trainer.py": 400,
    "producers/worker.py": 400,
}
"""Tighter limits, by path: the two roles' main loops, which must read top to bottom."""

SCANNED = ["tools", "tests"]
"""Folders whose doc references are checked besides the source folders."""

_REF = re.compile(
    r"(?P<path>\bdocs/[A-Za-z0-9_.-]+?\.md|\bDESIGN\.md)"
    r"(?:(?:'s|,)?[\s#]*(?:section[\s#]+)?\(?[\s#]*\"(?P<title>[^\"\n]+)\""
    r"|(?:'s|,)?[\s#]*section[\s#]+(?P<number>\d+(?:\.\d+)*)\b)?"
)
"""A reference: a path, then maybe a quoted section title or a section number."""

_HEADING = re.compile(r"^#+\s+(.+?)\s*$", re.MULTILINE)
_BOLD_LEAD = re.compile(r"^\*\*(.+?)\*\*", re.MULTILINE)


def source_folders(root: Path = ROOT) -> list[Path]:
    """The folders pyproject.toml's package-dir maps to subpackages of ``asyncrl``."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    return sorted({root / f for f in pyproject["tool"]["setuptools"]["package-dir"].values()})


def python_files(folders: Iterable[Path]) -> list[Path]:
    return sorted(p for f in folders for p in f.rglob("*.py") if "__pycache__" not in p.parts)


def oversized(root: Path = ROOT) -> list[str]:
    """One line per source module over its limit, longest first."""
    over = []
    for path in python_files(source_folders(root)):
        rel = path.relative_to(root).as_posix()
        limit = LIMITS.get(rel, MAX_LINES)
        lines = len(path.read_text().splitlines())
        if lines > limit:
            over.append((lines, f"{rel}: {lines} lines, over its limit of {limit}"))
    return [line for _n, line in sorted(over, reverse=True)]


def sections(doc: Path) -> list[str]:
    """A doc's headings and bold paragraph leads, lower-cased, without markup."""
    text = doc.read_text()
    found = _HEADING.findall(text) + _BOLD_LEAD.findall(text)
    return [re.sub(r"[`*_]", "", s).strip().lower() for s in found]


def _normal(title: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[`*_]", "", title)).strip().lower()


def bad_references(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    """One line per reference naming a doc or a section that does not exist."""
    problems = []
    known: dict[str, list[str] | None] = {}
    for path in files:
        text = path.read_text()
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
        for match in _REF.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            where = f"{rel}:{line}"
            name = match["path"]
            if name == "DESIGN.md":
                problems.append(f"{where}: cites DESIGN.md; the design is docs/design.md")
                continue
            if name not in known:
                doc = root / name
                known[name] = sections(doc) if doc.is_file() else None
            headings = known[name]
            if headings is None:
                problems.append(f"{where}: cites {name}, which does not exist")
            elif match["number"]:
                problems.append(
                    f"{where}: cites {name} section {match['number']}; its sections have "
                    "names, not numbers: quote one"
                )
            elif match["title"] and not any(
                h.startswith(_normal(match["title"])) for h in headings
            ):
                problems.append(f'{where}: cites {name}, "{match["title"]}": no such section')
    return problems


def main() -> int:
    scanned = python_files([*source_folders(ROOT), *(ROOT / f for f in SCANNED)])
    files = [f for f in scanned if f != Path(__file__).resolve()]  # this file names the errors
    problems = oversized(ROOT) + bad_references(files, ROOT)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
