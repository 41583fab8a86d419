"""Docs that are generated from code stay in step with it."""

from pathlib import Path

from asyncrl.ops.config_docs import config_reference

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_reference_is_up_to_date():
    on_disk = (ROOT / "docs" / "configuration.md").read_text()
    assert on_disk == config_reference(), (
        "docs/configuration.md is stale: python -m asyncrl.ops.config_docs > docs/configuration.md"
    )


def test_every_config_key_is_documented():
    undocumented = [
        line.split("`")[1]
        for line in config_reference().splitlines()
        if line.startswith("| `") and line.rstrip().endswith("|  |")
    ]
    assert not undocumented, f"config keys without a docstring: {undocumented}"


def test_every_config_keys_type_reads_as_a_user_writes_it():
    """pydantic's constraint wrappers stayed in the reference (and every --help) as
    ``dict[str, Annotated[int, FieldInfo(...)]]``."""
    from asyncrl.config import RunConfig
    from asyncrl.ops.config_docs import _rows

    types = {key: type_name for key, type_name, _, _ in _rows(RunConfig, "")}
    assert types["kafka.topics.partitions"] == "dict[str, int]"
    assert types["trainer.logger"] == 'list["console" or "tensorboard"]'
    assert types["kafka.bootstrap_servers"] == "str | None"
    odd = {
        k: t
        for k, t in types.items()
        if any(w in t for w in ("Annotated", "FieldInfo", "Literal["))
    }
    assert not odd


def test_package_list_matches_the_tree():
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    roots = {folder: package for package, folder in package_dir.items()}
    found = set()
    for folder, package in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([package, *rel]))
    assert found == listed


def test_observability_quotes_the_span_event_a_sync_leaves():
    """The sample diagram said an "interrupted" event; the worker adds "interrupted by a
    weight sync", which is what a trace viewer's search has to be given."""
    from asyncrl.producers.spans import INTERRUPTED_EVENT

    doc = (ROOT / "docs" / "observability.md").read_text()
    assert f'"{INTERRUPTED_EVENT}"' in doc
