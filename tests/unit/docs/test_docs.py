"""Docs that are generated from code stay in step with it."""

import argparse
import functools
import re
from pathlib import Path
from typing import NoReturn

from asyncrl.ops.config_docs import config_reference

ROOT = Path(__file__).resolve().parents[3]


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


# --- Every command and config key the docs show exists --------------------------------------
# README.md and docs/*.md show commands to copy; a renamed flag or key left a doc that fails when
# pasted. docs/configuration.md is generated (checked above); docs/benchmarks.md's commands are
# how its tables were made, so they are checked too (its figures are history, not checked).

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BENCHMARKS = {"benchmarks.md", "benchmarks-archive.md"}
"""The benchmark pages: their tables record settings measured once (a scratch key, a variable)."""


def _doc_commands() -> list[tuple[str, str, bool]]:
    """(doc, command, whole) for every ``asyncrl ...`` line of a fenced block (whole: to be
    run as it is) and every inline ```asyncrl ...``` span (which may name a command without
    its arguments), the shell's line continuations joined and comments cut; and the examples
    of ``asyncrl --help``."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                m = re.match(r"\s*(?:\.venv/bin/)?(asyncrl\s.*)", line)
                if m:
                    found.append((doc.name, m.group(1).split(" # ")[0].split("   #")[0], True))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for m in re.finditer(r"`(?:\.venv/bin/)?(asyncrl [^`]+)`", prose):
            for name in " ".join(m.group(1).split()).split(" | "):  # `asyncrl inspect | audit`
                found.append(
                    (doc.name, name if name.startswith("asyncrl") else f"asyncrl {name}", False)
                )
    from asyncrl.cli import EPILOG  # `asyncrl --help`'s examples: a command, two spaces, a note

    for line in EPILOG.splitlines():
        if line.startswith("  asyncrl "):
            found.append(("asyncrl --help", re.split(r"\s{2,}", line.strip())[0], True))
    return found


def _words(command: str) -> list[str]:
    """A doc's command as argv: placeholders (``<run_id>``, ``RUN``, ``a|b``, ``[--opt X]``)
    made concrete enough to parse; a trailing ``&`` or ``...`` dropped."""
    command = re.sub(r"<[^>]*>", "x", command).replace("[", "").replace("]", "")
    words = []
    for w in command.split()[1:]:
        if w in ("&", "...", "|"):
            continue
        w = w.split("|")[0] if not w.startswith("--") or "=" not in w else w
        words.append("1" if len(w) == 1 and w.isalpha() else w)  # --batch B, --worker-id i
    return words


@functools.cache
def _config_keys() -> tuple[set[str], set[str]]:
    """Every config key, and those of dict type (whose sub-keys a user names)."""
    from asyncrl.config import RunConfig
    from asyncrl.ops.config_docs import _rows

    rows = _rows(RunConfig, "")
    return {r[0] for r in rows}, {r[0] for r in rows if r[1].startswith("dict[")}


def _known_key(key: str) -> bool:
    """A config key, a section of them, a dict key's entry, or one of verl's names that
    asyncrl loads (an alias, an ignored or a fixed key)."""
    from asyncrl.config.verl_keys import lookup

    keys, dicts = _config_keys()
    return (
        key in keys
        or any(k.startswith(key + ".") for k in keys)
        or any(key.startswith(d + ".") for d in dicts)
        or lookup(key) is not None
    )


class _ParseError(Exception):
    """What argparse would print before exiting 2."""


class _Exited(Exception):
    """``--help`` or ``--help-keys``: printed what it shows, and would exit 0."""


def _raise(self: argparse.ArgumentParser, message: str) -> NoReturn:
    raise _ParseError(message)


def _exit(self: argparse.ArgumentParser, status: int = 0, message: str | None = None) -> NoReturn:
    raise _Exited()


def test_every_asyncrl_command_the_docs_show_parses(monkeypatch):
    """Each subcommand, flag and choice of a documented command exists, each override names a
    key, and each ``--config`` of a shipped name or a file of this repository is there."""
    from asyncrl.cli import build_parser

    monkeypatch.setattr(argparse.ArgumentParser, "error", _raise)
    monkeypatch.setattr(argparse.ArgumentParser, "exit", _exit)
    parser = build_parser()
    bad = []
    commands = _doc_commands()
    assert len(commands) > 100  # the extraction itself still finds the docs' commands
    for doc, command, whole in commands:
        argv = _words(command)
        try:
            args, extra = parser.parse_known_args(argv)
        except _ParseError as err:
            if whole or "arguments are required" not in str(err):  # else a command's name
                bad.append(f"{doc}: {command!r}: {err}")
            continue
        except _Exited:
            continue
        stray = [a for a in extra if a.startswith("-") or "=" not in a]
        if stray:
            bad.append(f"{doc}: {command!r}: unrecognized {stray}")
        for override in [*getattr(args, "overrides", []), *extra]:
            key = override.split("=", 1)[0].lstrip("+")
            if "=" in override and not _known_key(key):
                bad.append(f"{doc}: {command!r}: no config key {key!r}")
        config = getattr(args, "config", None)
        if config and config != "x" and not config.startswith("runs/"):
            shipped = ROOT / "asyncrl" / "configs" / f"{config}.yaml"
            in_repo = config.split("/")[0] in ("tests", "asyncrl", "docker")
            if ("/" not in config and not config.endswith(".yaml") and not shipped.exists()) or (
                in_repo and not (ROOT / config).exists()
            ):
                bad.append(f"{doc}: {command!r}: no config {config!r}")
    assert not bad, "\n".join(bad)


def _is_code_name(name: str) -> bool:
    """``kafka.read_topics_watermarks``, ``kafka.settings.X``: a name in asyncrl's packages."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(["asyncrl", *parts[:i]]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_config_key_the_docs_name_exists():
    """A dotted name in backticks under a config section (``trainer.save_freq``) is a key, a
    section, a dict key's entry, or a verl key asyncrl loads; else a name in the code (a
    module, a function, a span's name as the code writes it)."""
    from asyncrl.config import RunConfig

    sections = set(RunConfig.model_fields)
    code = "\n".join(
        p.read_text()
        for folder in ("asyncrl", "producers", "consumers", "sync", "launch", "ops", "bench")
        for p in (ROOT / folder).rglob("*.py")
    )
    bad = []
    for doc in DOCS:
        if doc.name == "configuration.md":  # generated from the keys themselves
            continue
        text = doc.read_text()
        if doc.name in BENCHMARKS:  # their tables are history: a scratch key measured once
            text = "\n".join(line for line in text.splitlines() if not line.startswith("|"))
        for span in re.findall(r"`([^`\n]+)`", text):
            for m in re.finditer(r"(?<![\w/.])\+{0,2}([a-z_]+(?:\.[a-z_0-9]+)+)(?![\w/(])", span):
                name = m.group(1)
                if name.split(".")[0] not in sections or _known_key(name):
                    continue
                if not (_is_code_name(name) or f'"{name}"' in code):
                    bad.append(f"{doc.name}: `{span}` names {name!r}, no config key")
    assert not bad, "\n".join(sorted(set(bad)))


def test_every_repository_path_the_docs_name_exists():
    """``tools/role_memory.py``, ``producers/engines/base.py``: a path under one of the
    repository's folders, in backticks or a link, is there (a file moved left docs pointing
    at nothing), as is any ``*.py``/``.sh``/``.yaml``/``.toml`` path. Run directories
    (``runs/...``), verl's files and placeholders (``<run_id>``) aside."""
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    folders -= {"runs", "data", "build"}
    bad = []
    for doc in DOCS:
        text = doc.read_text()
        spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"\]\(((?:\.\./)?[\w./-]+)\)", text)
        for span in spans:
            for m in re.finditer(r"(?<![\w/.])((?:\.\./)?[\w.-]+(?:/[\w.-]+)+/?)", span):
                path = m.group(1)
                base = (ROOT / "docs") if path.startswith("../") else ROOT
                if path.startswith("../"):
                    path = path[3:]
                named = path.split("/")[0] in folders or re.search(r"\.(py|sh|yaml|toml)$", path)
                theirs = path.startswith(
                    ("runs/", "data/", "verl/", "recipe/", "fully_async_policy/")
                )
                if not named or theirs or any(c in span for c in "<*{"):  # a run's, verl's
                    continue
                if not (base / path).exists() and not (ROOT / path).exists():
                    bad.append(f"{doc.name}: `{span}` names {path!r}, not in the repository")
    assert not bad, "\n".join(sorted(set(bad)))


def test_every_environment_variable_the_docs_name_is_read():
    """``ASYNCRL_SPAWN``, ``OTEL_SDK_DISABLED``, ``KAFKA_SASL_PASSWORD``: each variable the
    docs tell a user to set is named in the code that reads it (docker/'s scripts included) (docs/benchmarks.md's figures
    aside: an experiment's setting there is history)."""
    code = "\n".join(
        p.read_text()
        for folder in ("asyncrl", "config", "telemetry", "launch", "producers", "consumers")
        for p in (ROOT / folder).rglob("*.py")
    ) + "\n".join(p.read_text() for p in (ROOT / "docker").glob("*.sh"))
    bad = [
        f"{doc.name}: {name}"
        for doc in DOCS
        if doc.name not in BENCHMARKS
        for name in set(re.findall(r"\b(?:ASYNCRL|OTEL|KAFKA)_[A-Z0-9_]+\b", doc.read_text()))
        if name not in code
    ]
    assert not bad, f"variables the docs name that no code reads: {sorted(bad)}"


def test_every_make_target_and_extra_the_docs_name_exists():
    """``make lint``, ``pip install 'asyncrl[ray]'``: a target of the Makefile, an extra of
    pyproject.toml."""
    import tomllib

    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    bad = []
    for doc in DOCS:
        text = doc.read_text()
        blocks = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", text, re.S))
        named = re.findall(r"`make ([a-z][a-z-]*)[`' ]", text) + re.findall(
            r"^make ([a-z][a-z-]*)", blocks, re.M
        )
        bad += [f"{doc.name}: make {t}" for t in named if t not in targets]
        bad += [
            f"{doc.name}: asyncrl[{e}]"
            for e in re.findall(r"asyncrl\[([a-z-]+)\]", text)
            if e not in extras
        ]
    assert targets >= {"run", "test", "lint"}
    assert not bad, bad


def test_every_function_the_docs_place_in_a_file_is_there():
    """observability.md's metric table says where each metric is computed (``consumers/update.py``
    ``data_metrics``), design.md where a class lives (``Unscored`` in ``producers/in_flight.py``):
    each name is defined in that file."""
    pairs = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"`((?:[a-z_]+/)+[a-z_]+\.py)`((?:,? `[A-Za-z_][\w.]*`)+)", text):
            pairs += [(doc.name, m.group(1), n) for n in re.findall(r"`([\w.]+)`", m.group(2))]
        for m in re.finditer(
            r"`([A-Za-z_][\w.]*)(?:\(\))?` (?:in|of) `((?:[a-z_]+/)+\w+\.py)`", text
        ):
            pairs.append((doc.name, m.group(2), m.group(1)))
        for m in re.finditer(r"`([A-Z]\w*)` \(`((?:[a-z_]+/)+\w+\.py)`", text):  # a class
            pairs.append((doc.name, m.group(2), m.group(1)))
    assert len(pairs) > 30  # the metric table's rows are still found
    bad = []
    for doc, path, name in pairs:
        if not (ROOT / path).exists():
            continue  # verl's files, named the same way; ours are checked by the path test
        short = name.split(".")[-1]
        pattern = rf"\b(def|class)\s+{short}\b|^\s*{short}\s*[:=]"
        if not re.search(pattern, (ROOT / path).read_text(), re.M):
            bad.append(f"{doc}: `{path}` `{name}`: no such definition there")
    assert not bad, "\n".join(bad)


def test_faults_lists_the_keys_a_resumed_run_may_not_change():
    """docs/faults.md's resume row names each key of launch/resume_check.py's FIXED (a
    prefix as ``data.*``, a key by its last parts such as ``actor.ppo_mini_batch_size``; the
    model as "the model") and each exception under such a prefix (``data.max_response_length``
    may change: the row said all of ``data.*`` was refused)."""
    from asyncrl.launch.resume_check import FIXED, FREE

    row = next(
        line
        for line in (ROOT / "docs" / "faults.md").read_text().splitlines()
        if line.startswith("| an unfinished run is resumed with a changed config")
    )
    named = set(re.findall(r"`([\w.*]+)`", row))

    def names(key: str) -> bool:
        key = key.removesuffix(".")
        return any(key == n or key.endswith("." + n) for n in (n.removesuffix(".*") for n in named))

    missing = [k for k in FIXED if k != "actor_rollout_ref.model." and not names(k)]
    free = [k for k in FREE if not k.startswith("actor_rollout_ref.model.") and k not in named]
    assert "the model" in row
    assert not missing, f"fixed keys docs/faults.md does not name: {missing}"
    assert not free, f"keys that may change under a fixed prefix, not named: {free}"


def test_design_lists_the_counts_audit_prints():
    """docs/design.md's "Auditing a run" table has one row per violation ``asyncrl audit``
    counts (ops/audit.py's VIOLATIONS), and names the counts shown beside them that it says
    are not violations."""
    from asyncrl.ops.audit import INFO, VIOLATIONS

    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## Auditing a run", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert rows == list(VIOLATIONS)
    beside = re.findall(r"\(`(\w+)`", section.split("Not violations", 1)[1].split("\n\n")[0])
    assert beside and set(beside) <= set(INFO) | {"undecodable"}


def test_every_yaml_the_docs_show_loads(tmp_path):
    """A tools file (``tools:``), an interaction file (``interaction:``) or a run config, as
    the docs show them, loads with the loader asyncrl reads it with."""
    from asyncrl.config import load_config
    from asyncrl.producers.agent.interaction import load_interactions
    from asyncrl.producers.tools.registry import load_tools

    blocks = [
        (doc.name, block)
        for doc in DOCS
        for block in re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)
    ]
    assert len(blocks) >= 3
    for i, (doc, block) in enumerate(blocks):
        path = tmp_path / f"{i}.yaml"
        path.write_text(block)
        first = block.split(":", 1)[0].strip()
        loader = {"tools": load_tools, "interaction": load_interactions}.get(first, load_config)
        try:
            assert loader(path), f"{doc}: a {first} YAML that loads nothing"
        except Exception as err:
            raise AssertionError(f"{doc}: its YAML block {i} ({first}): {err}") from err


def _defined(name: str) -> bool:
    """``producers.tools.base.Tool``: a module of asyncrl's folders (read, not imported, so
    no torch) that defines or imports the rest."""
    import tomllib

    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        folder = ROOT / dirs.get(".".join(["asyncrl", *parts[:1]]), "asyncrl/" + parts[0])
        path = folder.joinpath(*parts[1:i])
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if source.exists():
            rest = parts[i:]
            if not rest:
                return True
            pattern = rf"^\s*(def|class|async def)\s+{rest[0]}\b|^\s*{rest[0]}\s*[:=]|\bimport\b.*\b{rest[0]}\b"
            return len(rest) <= 2 and re.search(pattern, source.read_text(), re.M) is not None
    return False


def test_every_python_name_the_docs_give_imports():
    """``asyncrl.producers.tools.base.Tool``, ``asyncrl.tasks.files.pick_interaction``: a name
    under one of asyncrl's packages, as the docs tell a user to import or subclass it, is
    there (span attributes such as ``asyncrl.step`` name no package, and are left alone)."""
    bad = []
    for doc in DOCS:
        for span in re.findall(r"`([^`\n]+)`", doc.read_text()):
            for name in re.findall(r"(?<![\w/.-])asyncrl\.((?:\w+\.?)+\w)", span):
                top = name.split(".")[0]
                if not ((ROOT / top).is_dir() or (ROOT / "asyncrl" / top).is_dir()):
                    continue
                if not _defined(name):
                    bad.append(f"{doc.name}: `{span}`: asyncrl.{name} is not there")
    assert not bad, "\n".join(bad)


THEIRS = {
    "AutoModelForCausalLM": "transformers",
    "AutoTokenizer": "transformers",
    "TokenizersBackend": "transformers",
    "DynamicCache": "transformers",
    "RequestOutput": "vLLM",
    "BaseTool": "verl",
    "BaseInteraction": "verl",
    "MetricsAggregator": "verl",
}
"""Class names the docs give in backticks that are another project's."""


def test_every_class_the_docs_name_is_defined():
    """A class or event in backticks (``SyncFollower``, ``WeightsPublished``) is defined in
    asyncrl's code (a rename left the docs naming a class that no longer is), or is one of
    THEIRS."""
    folders = ("asyncrl", "producers", "consumers", "sync", "launch", "ops", "bench", "config")
    folders += ("kafka", "telemetry", "schemas")
    code = "\n".join(p.read_text() for f in folders for p in (ROOT / f).rglob("*.py"))
    defined = set(re.findall(r"^\s*class (\w+)", code, re.M))
    defined |= set(re.findall(r"^(\w+)\s*[:=]", code, re.M))
    bad = sorted(
        {
            f"{doc.name}: `{name}`"
            for doc in DOCS
            for span in re.findall(r"`([^`\n]+)`", doc.read_text())
            for name in re.findall(r"^([A-Z][a-z]+(?:[A-Z][a-z0-9]*)+)$", span)
            if name not in defined and name not in THEIRS
        }
    )
    assert not bad, f"classes the docs name that the code does not define: {bad}"


def _titles(doc: Path) -> list[str]:
    """What a reference can name in a doc: its headings, bold runs and list items' starts."""
    text = doc.read_text()
    return [
        *re.findall(r"^#+\s+(.*)$", text, re.M),
        *re.findall(r"\*\*([^*]+)\*\*", text),
        *re.findall(r"^[-*] (.{1,80})", text, re.M),
    ]


def test_every_section_a_doc_refers_to_is_there():
    """``(docs/design.md, "Rewards")`` or ``"Auditing a run" in docs/design.md``: the doc has
    a heading, bold run or list item starting so (a renamed section left a reference to
    nothing)."""
    refs = []
    for doc in DOCS:
        text = " ".join(doc.read_text().split())
        for file, title in re.findall(
            r"\b((?:docs/)?[a-z-]+\.md)(?:\]\([^)]*\))?, \"([^\"]+)\"", text
        ):
            refs.append((doc.name, file, title))
        for title, file in re.findall(r"\"([^\"]+)\" in \[?((?:docs/)?[a-z-]+\.md)", text):
            refs.append((doc.name, file, title))
        for title in re.findall(r"\(\"([^\"]+)\" (?:below|above)\)", text):  # in the same doc
            refs.append((doc.name, str(doc.relative_to(ROOT)), title))
    assert len(refs) > 20
    bad = []
    for doc, file, title in refs:
        target = (
            ROOT / file if file.startswith("docs/") or file == "README.md" else ROOT / "docs" / file
        )
        if not any(t.startswith(title) for t in _titles(target)):
            bad.append(f"{doc}: {file}, {title!r}: no such section")
    assert not bad, "\n".join(bad)


def test_readme_layout_table_matches_the_packages():
    """README's "Layout" table: each folder with a package is that package's folder in
    pyproject.toml's package-dir, and every such folder has a row."""
    import tomllib

    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    layout = (ROOT / "README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)/` \| `(asyncrl[\w.]*)` \|", layout, re.M))
    assert rows == {folder: package for package, folder in dirs.items()}


def test_design_topic_table_gives_each_schemas_version():
    """design.md's Topics table names each message's schema tag (``sample/5``); a schema
    version bump left it naming the last one."""
    from asyncrl.schemas import control, partial, prompt, sample, step

    topics = (ROOT / "docs" / "design.md").read_text().split("## Topics", 1)[1].split("\n## ")[0]
    for module in (partial, prompt, sample, step):
        assert f"`{module.NAME}/{module.VERSION}`" in topics, module.NAME
    assert f"`control.<Event>/{control.VERSION}`" in topics


def test_agent_key_table_gives_each_keys_default():
    """agent.md's table of ``multi_turn.*`` keys says each one's default as the config has it."""
    from asyncrl.config import RunConfig
    from asyncrl.ops.config_docs import _rows

    defaults = {key: default.strip("`") for key, _, default, _ in _rows(RunConfig, "")}
    text = (ROOT / "docs" / "agent.md").read_text()
    prefix, table = re.search(
        r"^\| key \(`([\w.]+)\.\*`\) \| default \|.*?\n((?:\|.*\n)+)", text, re.M
    ).groups()
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", table, re.M)
    assert len(rows) > 5
    wrong = [
        (key, shown.strip(), defaults.get(f"{prefix}.{key}"))
        for key, shown in rows
        if defaults.get(f"{prefix}.{key}", "").strip('"') != shown.strip()
    ]
    assert not wrong, f"(key, agent.md's default, the config's): {wrong}"


def test_every_short_config_key_the_docs_name_exists():
    """A key the docs shorten (``actor.ppo_mini_batch_size``, ``multi_turn.enable``,
    ``fsdp_config.model_dtype``) ends some full key: asyncrl's, a section, a dict key's entry
    or a verl key asyncrl loads."""
    from asyncrl.config import RunConfig
    from asyncrl.config.verl_keys import VERL_KEYS, lookup
    from asyncrl.ops.config_docs import _rows

    rows = _rows(RunConfig, "")
    full = {r[0] for r in rows} | {k.removesuffix(".*") for k in VERL_KEYS}
    full |= {k.rsplit(".", i)[0] for k in set(full) for i in (1, 2, 3)}  # sections
    inner = {p for k in full for p in k.split(".")[1:-1]}
    dicts = {r[0].rsplit(".", 1)[-1] for r in rows if r[1].startswith("dict[")}
    sections = set(RunConfig.model_fields)
    bad = []
    for doc in DOCS:
        text = doc.read_text()
        if doc.name in BENCHMARKS:  # their tables are history
            text = "\n".join(line for line in text.splitlines() if not line.startswith("|"))
        for span in re.findall(r"`([^`\n]+)`", text):
            for name in re.findall(r"(?<![\w/.])([a-z_]+(?:\.[a-z_0-9]+)+)(?![\w/(])", span):
                first = name.split(".")[0]
                if first in sections or first not in inner or lookup(name) is not None:
                    continue
                if not any(k == name or k.endswith("." + name) for k in full) and not any(
                    f".{d}." in f".{name}" for d in dicts
                ):
                    bad.append(f"{doc.name}: `{span}` names {name!r}, which ends no key")
    assert not bad, "\n".join(sorted(set(bad)))
