"""What loading a config found: each key's decision, the start-up warning, and the problems."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from asyncrl.config.base import ConfigError
from asyncrl.config.sections import RunConfig


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
        return f"{self.key}={show(self.value)} ({self.source})"


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
            f"{d.where()} -> {d.target}={show(d.result)}"
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


def show(value: Any) -> str:
    """A value as the user would write it: text as it is, anything else as YAML's flow style."""
    if isinstance(value, str):
        return value
    return (
        yaml.safe_dump(value, default_flow_style=True, width=1_000_000)
        .strip()
        .removesuffix("\n...")
    )
