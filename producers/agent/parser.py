"""How tool calls look in the model's text, and how tool responses are written back.

Two formats (``multi_turn.format``):

- ``hermes``: what Qwen-style chat models emit, as in verl:
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "347*86"}}</tool_call>``,
  any number per turn; the turn ends at EOS, and responses are appended as
  ``<tool_response>...</tool_response>`` blocks (with a chat model's template, as the
  template writes tool messages: ``AgentLoop._framed``).
- ``compact``: for the character-level demo model, which cannot spell JSON: ``[347*86]``
  calls the first tool with its first required argument; ``]`` ends the turn. The response is
  written ``=29842 `` (``=? `` for an error: the demo vocabulary cannot spell messages; the
  message itself is kept in the agent's ``messages``).
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Protocol

from asyncrl.producers.tools.base import Tool, ToolCall, ToolResult


class ToolParser(Protocol):
    stop_texts: tuple[str, ...]
    """Texts (single tokens) that end an assistant turn besides EOS."""

    def parse(self, turn_text: str) -> list[ToolCall]:
        """The calls in one assistant turn (none: the turn is a final answer)."""
        ...

    def render(self, results: list[ToolResult]) -> str:
        """The text appended after the turn for its calls' results."""
        ...


class HermesParser:
    stop_texts: tuple[str, ...] = ()
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, turn_text: str) -> list[ToolCall]:
        calls = []
        for body in self._CALL.findall(turn_text):
            try:
                obj = json.loads(body)
            except json.JSONDecodeError as err:
                calls.append(ToolCall("", error=f"malformed tool call (not JSON: {err.msg})"))
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                calls.append(ToolCall("", error="malformed tool call (no name)"))
                continue
            args = obj.get("arguments", {})
            if isinstance(args, str):  # some models write the arguments as a JSON string
                with contextlib.suppress(json.JSONDecodeError):
                    args = json.loads(args)
            if not isinstance(args, dict):
                calls.append(ToolCall(obj["name"], error="arguments must be a JSON object"))
                continue
            calls.append(ToolCall(obj["name"], args))
        return calls

    def render(self, results: list[ToolResult]) -> str:
        return "".join(f"\n<tool_response>\n{r.text}\n</tool_response>\n" for r in results)


class CompactParser:
    stop_texts: tuple[str, ...] = ("]",)

    def __init__(self, tool: Tool) -> None:
        required = tool.parameters.get("required", [])
        if not required:
            raise ValueError(f"compact format: tool {tool.name!r} has no required argument")
        self.tool, self.argument = tool.name, required[0]

    def parse(self, turn_text: str) -> list[ToolCall]:
        if not turn_text.endswith("]"):
            return []
        start = turn_text.rfind("[")
        if start < 0:
            return [ToolCall(self.tool, error="malformed tool call (no opening bracket)")]
        return [ToolCall(self.tool, {self.argument: turn_text[start + 1 : -1]})]

    def render(self, results: list[ToolResult]) -> str:
        return "".join(f"={r.text if r.ok else '?'} " for r in results)


class SingleTurn:
    """No tools: every turn is a final answer (the single-turn rollout, as an agent loop)."""

    stop_texts: tuple[str, ...] = ()

    def parse(self, turn_text: str) -> list[ToolCall]:
        return []

    def render(self, results: list[ToolResult]) -> str:
        return ""


def make_parser(fmt: str, tools: dict[str, Tool]) -> ToolParser:
    if fmt == "hermes":
        return HermesParser()
    if fmt == "compact":
        if not tools:
            raise ValueError("compact format needs a tool")
        return CompactParser(next(iter(tools.values())))
    raise ValueError(f"unknown tool-call format {fmt!r} (hermes, compact)")
