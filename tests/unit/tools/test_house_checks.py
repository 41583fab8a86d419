"""tools/house_checks.py, which `make lint` runs: it fails on a module over its line limit and
on a doc reference naming a file or section that does not exist, and passes on good ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("house_checks", ROOT / "tools" / "house_checks.py")
assert _spec and _spec.loader
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)

# Bad references spelled in two pieces, so that the check does not flag this file:
OLD_NAME = "DESIGN" + ".md"
DESIGN = "docs/" + "design.md"
MISSPELT = "docs/" + "desing.md"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository in miniature: two mapped folders, a tests folder, one doc."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "asyncrl" = "asyncrl", '
        '"asyncrl.consumers" = "consumers" }\n'
    )
    for folder in ("asyncrl", "consumers", "tests"):
        (tmp_path / folder).mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text(
        "# Design\n\n## Layers: the folders\n\ntext\n\n**Each process, measured** (a table)\n"
    )
    return tmp_path


def lines(n: int) -> str:
    return "x = 1\n" * n


def test_a_module_over_500_lines_fails_and_one_at_500_passes(repo):
    (repo / "asyncrl" / "ok.py").write_text(lines(500))
    assert checks.oversized(repo) == []
    (repo / "asyncrl" / "big.py").write_text(lines(501))
    assert checks.oversized(repo) == ["asyncrl/big.py: 501 lines, over its limit of 500"]


def test_the_trainer_has_the_tighter_limit_and_tests_are_not_sized(repo):
    (repo / "consumers" / "trainer.py").write_text(lines(401))
    (repo / "consumers" / "other.py").write_text(lines(401))
    (repo / "tests" / "test_long.py").write_text(lines(900))
    assert checks.oversized(repo) == ["consumers/trainer.py: 401 lines, over its limit of 400"]


@pytest.mark.parametrize(
    "good",
    [
        f'"""The layers ({DESIGN}, "Layers")."""',
        f'"""The layers ({DESIGN} ("Layers"))."""',
        f'# {DESIGN}\'s "layers: the folders" says so',
        f'"""Measured: {DESIGN}\n("Each process, measured")."""',
        f'"""See {DESIGN} section "Layers"."""',
        f'"""See {DESIGN} for why."""',
    ],
)
def test_a_reference_to_a_doc_and_section_that_exist_passes(repo, good):
    path = repo / "asyncrl" / "mod.py"
    path.write_text(good + "\n")
    assert checks.bad_references([path], repo) == []


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (f'"""The sync ({OLD_NAME} section 4)."""', "the design is docs/design.md"),
        (f'"""The sync ({DESIGN} section 4)."""', "names, not numbers"),
        (f'"""The sync ({DESIGN}, "Topics")."""', '"Topics": no such section'),
        (f'"""See {MISSPELT}."""', f"{MISSPELT}, which does not exist"),
    ],
)
def test_a_reference_to_a_missing_doc_or_section_fails_naming_the_line(repo, bad, said):
    path = repo / "asyncrl" / "mod.py"
    path.write_text("x = 1\n" + bad + "\n")
    (problem,) = checks.bad_references([path], repo)
    assert problem.startswith("asyncrl/mod.py:2: ") and said in problem


def test_the_script_exits_1_on_a_problem(repo, monkeypatch, capsys):
    (repo / "consumers" / "mod.py").write_text(f"# see {OLD_NAME}\n")
    monkeypatch.setattr(checks, "ROOT", repo)
    assert checks.main() == 1
    assert "consumers/mod.py:1: cites " + OLD_NAME in capsys.readouterr().out


def test_the_repository_s_doc_references_all_resolve():
    files = checks.python_files([*checks.source_folders(), ROOT / "tools", ROOT / "tests"])
    files = [f for f in files if f.name != "house_checks.py"]
    assert checks.bad_references(files) == []
