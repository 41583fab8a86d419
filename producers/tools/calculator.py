"""A calculator: evaluates an arithmetic Python expression in the sandbox (see sandbox.py).

Only numbers, + - * / // % ** and parentheses parse; anything else is refused before it runs,
and what does run (``9**9**9``) is bounded by the sandbox's CPU, memory and wall-time limits.
Pure and deterministic, so a call cut by a weight sync is simply run again on resume.
"""

from __future__ import annotations

import asyncio
from typing import Any

from asyncrl.producers.tools.base import Tool, ToolError
from asyncrl.producers.tools.sandbox import run_python

ARITHMETIC = frozenset(
    {
        "Expression",
        "Constant",
        "BinOp",
        "UnaryOp",
        "Add",
        "Sub",
        "Mult",
        "Div",
        "FloorDiv",
        "Mod",
        "Pow",
        "USub",
        "UAdd",
    }
)
"""The syntax an expression may use (ast node class names)."""

SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "e.g. 347*86"},
            },
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}


class CalculatorTool(Tool):
    """``config``: ``timeout_s`` (wall, default 5), ``cpu_s`` (1), ``memory_mb`` (256),
    ``max_length`` (characters of an expression, 200), ``fresh_interpreter`` (false: the
    sandbox server forks a child per call; true: a new interpreter per call, ~20x the CPU)."""

    def __init__(
        self, tool_schema: dict[str, Any] | None = None, config: dict[str, Any] | None = None
    ) -> None:
        super().__init__(tool_schema or SCHEMA, config)
        self.cpu_s = self.positive_int("cpu_s", 1)
        self.memory_mb = self.positive_int("memory_mb", 256)
        self.max_length = self.positive_int("max_length", 200)
        self.fresh_interpreter = self.config.get("fresh_interpreter", False)
        if not isinstance(self.fresh_interpreter, bool):
            raise ValueError(
                f"config.fresh_interpreter must be true or false, not {self.fresh_interpreter!r}"
            )

    def positive_int(self, key: str, default: int) -> int:
        value = self.config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"config.{key} must be a positive integer, not {value!r}")
        return value

    async def execute(self, arguments: dict[str, Any]) -> str:
        expression = arguments["expression"].strip()
        if not expression:
            raise ToolError("empty expression")
        if len(expression) > self.max_length:
            raise ToolError(f"expression longer than {self.max_length} characters")
        result = await asyncio.to_thread(
            run_python,
            expression,
            "eval",
            ARITHMETIC,
            self.cpu_s,
            self.memory_mb,
            # the sandbox's own wall limit, just inside the tool's timeout
            max(0.1, self.timeout_s - 0.05),
            fresh_interpreter=self.fresh_interpreter,
        )
        if not result.ok:
            raise ToolError(result.error)
        return result.output
