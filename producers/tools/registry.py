"""Tools from a YAML tool config (verl's ``multi_turn.tool_config_path`` format), and the
executor that runs their async calls beside the decoding loop.

The format, as in verl::

    tools:
      - class_name: asyncrl.producers.tools.calculator.CalculatorTool
        config: {timeout_s: 5, cpu_s: 1, memory_mb: 256}
        tool_schema:
          type: function
          function:
            name: calculator
            description: ...
            parameters: {type: object, properties: {...}, required: [...]}

``class_name`` is imported from the run's own config file (never from anything read off the
wire). Errors name the entry and key (``tools[0].class_name: ...``).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import importlib
import inspect
import threading
from collections.abc import Coroutine, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import yaml

from asyncrl.config import ConfigError, RunConfig
from asyncrl.producers.tools.base import Tool, ToolCall, ToolResult

T = TypeVar("T")


ENTRY_KEYS = ("class_name", "config", "tool_schema")
"""The keys of one entry under ``tools`` (verl's)."""


class ConfigFileError(ValueError):
    """A YAML config of classes (tools, interactions) cannot be used; the message names the
    file, entry and key."""


class ToolConfigError(ConfigFileError):
    """The tool config cannot be used."""


TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


def shipped_tools_path() -> Path:
    """The calculator's tool config, shipped with the package."""
    import asyncrl

    return Path(asyncrl.__file__).parent / "configs" / "tools" / "calculator.yaml"


def run_tools(cfg: RunConfig) -> dict[str, Tool]:
    """The tools the run's agent loop calls: ``multi_turn.tool_config_path``'s, or the shipped
    calculator's; none with ``multi_turn.enable`` off."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    return load_tools(mt.tool_config_path or shipped_tools_path()) if mt.enable else {}


def tool_schemas(tools: dict[str, Tool]) -> list[dict[str, Any]] | None:
    """What a chat prompt's template gets as ``tools=`` (verl's ``tool_schemas``): the
    OpenAI-style schema of each tool, in the config's order; None without tools, so a
    template renders as it does with no ``tools`` at all."""
    return [tool.tool_schema for tool in tools.values()] or None


def prompt_tool_schemas(cfg: RunConfig) -> list[dict[str, Any]] | None:
    """:func:`tool_schemas` of the run's tools, for code that encodes prompts without an agent
    loop at hand (the data's length filter); ConfigError naming the key if they do not load."""
    try:
        return tool_schemas(run_tools(cfg))
    except ToolConfigError as err:
        raise ConfigError(f"{TOOL_CONFIG_KEY}: {err}") from None


def import_class(
    dotted: str, where: str, error: type[ConfigFileError] = ConfigFileError
) -> type[Any]:
    """The class ``dotted`` names (``pkg.mod.Class``), imported from the run's own config file;
    ``error`` naming ``where``'s ``class_name`` if it cannot be (also when the module's own
    code fails as it is imported: a syntax error, a missing API key)."""
    module_name, _, attr = dotted.rpartition(".")
    if not module_name:
        raise error(f"{where}.class_name: {dotted!r} is not a dotted path")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise error(f"{where}.class_name: cannot import {dotted!r}: {err}") from err
    except Exception as err:  # the module's own code failed: a SyntaxError, a RuntimeError
        raise error(
            f"{where}.class_name: importing {module_name!r} raised {type(err).__name__}: {err}"
        ) from err
    try:
        cls = getattr(module, attr)
    except AttributeError as err:
        raise error(f"{where}.class_name: cannot import {dotted!r}: {err}") from err
    if not isinstance(cls, type):
        raise error(f"{where}.class_name: {dotted!r} is not a class")
    return cls


def read_entries(
    path: str | Path,
    section: str,
    keys: tuple[str, ...],
    error: type[ConfigFileError] = ConfigFileError,
) -> tuple[Path, list[tuple[str, dict[str, Any]]]]:
    """The entries of the non-empty list under ``section`` of a YAML file, each with where it
    is (``file: section[i]``): a mapping with a ``class_name`` and no key outside ``keys`` (a
    typo would drop a setting silently). ``error`` names the file, the entry and the key."""
    path = Path(path).expanduser()
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as err:
        raise error(f"{path}: cannot read it: {err}") from err
    except yaml.YAMLError as err:
        raise error(f"{path}: not valid YAML: {err}") from err
    entries = (doc or {}).get(section) if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise error(f"{path}: expected a non-empty list under {section!r}")
    found = []
    for i, entry in enumerate(entries):
        where = f"{path}: {section}[{i}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise error(f"{where}.class_name: missing")
        for key in sorted(set(entry) - set(keys)):
            near = difflib.get_close_matches(str(key), keys, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise error(f"{where}.{key}: unknown key ({hint}an entry has {', '.join(keys)})")
        found.append((where, entry))
    return path, found


def _import_tool(dotted: str, where: str) -> type[Tool]:
    cls = import_class(dotted, where, ToolConfigError)
    if not issubclass(cls, Tool):
        raise ToolConfigError(f"{where}.class_name: {dotted!r} is not a Tool subclass")
    if not inspect.iscoroutinefunction(cls.execute):  # else every call is a TypeError
        raise ToolConfigError(
            f"{where}.class_name: {dotted}.execute must be an async def (run blocking code "
            "in it with asyncio.to_thread)"
        )
    return cls


def load_tools(path: str | Path) -> dict[str, Tool]:
    """The tools of a tool config file, by name."""
    _, entries = read_entries(path, "tools", ENTRY_KEYS, ToolConfigError)
    tools: dict[str, Tool] = {}
    for where, entry in entries:
        cls = _import_tool(str(entry["class_name"]), where)
        try:
            tool = cls(entry.get("tool_schema"), entry.get("config") or {})
        except (ValueError, TypeError, KeyError) as err:
            # A tool names a bad config key itself ("config.cpu_s must ..."); else the schema.
            why = f".{err}" if str(err).startswith("config.") else f".tool_schema: {err}"
            raise ToolConfigError(f"{where}{why}") from err
        except Exception as err:  # the tool's own start failed (a missing key file, a client)
            raise ToolConfigError(
                f"{where}: {cls.__name__}(tool_schema, config) raised {type(err).__name__}: {err}"
            ) from err
        if tool.name in tools:
            raise ToolConfigError(f"{where}.tool_schema.function.name: {tool.name!r} twice")
        tools[tool.name] = tool
    return tools


class ToolExecutor:
    """Runs tool calls on an asyncio loop in a background thread: the decoding loop submits
    a turn's calls and polls the future between steps, so tools and generation overlap."""

    def __init__(self, tools: dict[str, Tool]) -> None:
        self.tools = tools
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    async def _one(self, call: ToolCall) -> ToolResult:
        if call.error:
            return ToolResult(f"error: {call.error}", False)
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(f"error: no tool named {call.name!r} (tools: {known})", False)
        return await tool.call(call)

    async def _all(self, calls: Iterable[ToolCall]) -> list[ToolResult]:
        return list(await asyncio.gather(*(self._one(c) for c in calls)))

    def submit(self, calls: list[ToolCall]) -> Future[list[ToolResult]]:
        """Start ``calls`` concurrently; the future holds their results in order."""
        coro: Coroutine[Any, Any, list[ToolResult]] = self._all(calls)
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def submit_coroutine(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Run any coroutine on the executor's loop (an interaction's reply)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, calls: list[ToolCall]) -> list[ToolResult]:
        """``submit`` and wait."""
        return self.submit(calls).result()

    def close(self) -> None:
        # One pass of the loop first: coroutines submitted last (an interaction's end) start,
        # rather than being dropped unawaited by the stop.
        with contextlib.suppress(Exception):
            self.submit_coroutine(asyncio.sleep(0)).result(timeout=1)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> ToolExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
