"""The tool interface of the agent loop: a name, JSON-schema arguments, an async call with a
timeout. verl's shape (``tool_schema`` of type "function"), so its tool configs read the same.

A call never raises into the rollout: bad arguments, a failure or a timeout come back as a
``ToolResult`` with ``ok`` False and a message the model sees as the tool's response.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


class ToolError(Exception):
    """Raised by ``Tool.execute`` for a failure the model should read (the message is shown)."""


@dataclass(frozen=True)
class ToolCall:
    """A call the model wrote: the tool's name and its (parsed, not yet validated) arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    """Set when the model's call could not be parsed: it is answered with this, not run."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "error": self.error}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        return cls(str(d["name"]), dict(d.get("arguments") or {}), str(d.get("error", "")))


@dataclass(frozen=True)
class ToolResult:
    """What the model reads back: ``text`` is the output, or the error message if not ``ok``."""

    text: str
    ok: bool
    seconds: float = 0.0


def schema_errors(schema: dict[str, Any], args: Any) -> str | None:
    """The first way ``args`` breaks an object ``schema`` (required keys, property types,
    ``additionalProperties: false``, ``enum``), or None. The subset tool schemas use."""
    if not isinstance(args, dict):
        return f"arguments must be an object, not {type(args).__name__}"
    props: dict[str, Any] = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in args:
            return f"missing required argument {key!r}"
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            if schema.get("additionalProperties") is False:
                return f"unknown argument {key!r}"
            continue
        wanted = _JSON_TYPES.get(spec.get("type", ""), ())
        bad_bool = isinstance(value, bool) and spec.get("type") in ("integer", "number")
        if wanted and (not isinstance(value, wanted) or bad_bool):
            return f"argument {key!r} must be of type {spec['type']}"
        if "enum" in spec and value not in spec["enum"]:
            return f"argument {key!r} must be one of {spec['enum']}"
    return None


class Tool(ABC):
    """One tool. Subclasses implement :meth:`execute`; :meth:`call` validates and times it."""

    def __init__(
        self, tool_schema: dict[str, Any] | None, config: dict[str, Any] | None = None
    ) -> None:
        # None: the tool file has no tool_schema (a subclass may have a default, the calculator's)
        tool_schema = tool_schema or {}
        function = tool_schema.get("function")
        shape = "{type: function, function: {name: ..., description: ..., parameters: ...}}"
        if not tool_schema:
            raise ValueError(f"missing: a tool's schema is {shape}")
        if tool_schema.get("type") != "function":
            raise ValueError(f"type must be function, not {tool_schema.get('type')!r} ({shape})")
        if not isinstance(function, dict) or not function.get("name"):
            what = "function" if not isinstance(function, dict) else "function.name"
            raise ValueError(f"{what}: missing ({shape})")
        self.tool_schema = tool_schema
        self.name: str = function["name"]
        self.description: str = function.get("description", "")
        self.parameters: dict[str, Any] = function.get("parameters", {"type": "object"})
        self.config = dict(config or {})
        self.timeout_s = float(self.config.get("timeout_s", 5.0))

    def _warn_blocking(self, seconds: float) -> None:
        """Say once why a run stalls: every call of the worker waits behind a blocking one."""
        if getattr(self, "_warned_blocking", False):
            return
        self._warned_blocking = True
        log.warning(
            "tool %r: a call took %.1f s, over its timeout_s=%g, which could not stop it: a "
            "tool's execute (this one's, or one running beside it) blocks the event loop (a "
            "blocking call in an async def), and every tool call of this process waits behind "
            "it; run blocking code with asyncio.to_thread",
            self.name,
            seconds,
            self.timeout_s,
        )

    @abstractmethod
    async def execute(self, arguments: dict[str, Any]) -> str:
        """Run the tool on validated arguments and return the text the model reads (a str:
        anything else is answered as an error); raise ToolError with a message for the model."""

    async def call(self, call: ToolCall) -> ToolResult:
        """Validate, run with the timeout, and turn every failure into an error result."""
        t0 = time.monotonic()
        why = schema_errors(self.parameters, call.arguments)
        if why is not None:
            return ToolResult(f"error: {why}", False, time.monotonic() - t0)
        timed_out = ToolResult(
            f"error: timed out after {self.timeout_s:g} s", False, self.timeout_s
        )
        try:
            text = await asyncio.wait_for(self.execute(call.arguments), self.timeout_s)
        except TimeoutError:
            return timed_out
        except ToolError as err:
            return ToolResult(f"error: {err}", False, time.monotonic() - t0)
        except Exception as err:  # a tool's bug is the rollout's tool error, not its crash
            return ToolResult(f"error: {type(err).__name__}: {err}", False, time.monotonic() - t0)
        seconds = time.monotonic() - t0
        if seconds > self.timeout_s:  # the timeout could not fire: execute held the loop
            self._warn_blocking(seconds)
            return ToolResult(timed_out.text, False, seconds)
        if not isinstance(text, str):  # a verl tool's (ToolResponse, reward, metrics), a dict
            why = f"error: tool {self.name!r} returned {type(text).__name__}, not str"
            return ToolResult(why, False, seconds)
        return ToolResult(text, True, seconds)
