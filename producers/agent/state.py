"""The state of one multi-turn trajectory: everything needed to continue it in another process.

Token layout (one trajectory's response, what the trainer sees)::

    response_ids   = turn 1 (model) | tool response | turn 2 (model) | ...
    response_mask  =   1 1 1 1      |    0 0 0      |   1 1 1 1 1    |
    response_logprobs: the sampling logprob for mask-1 tokens, 0.0 for mask-0 tokens

so only the model's own tokens are trained on. ``turn_start`` is where the current assistant
turn began: while GENERATING, the engine holds ``response_ids[turn_start:]`` as its prefix.
The state is JSON (``to_json``/``from_json``), logged per trajectory in ``partials``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # Python 3.10 has no StrEnum: the same str-valued members, str() and format() their value
    from enum import Enum

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)


class Phase(StrEnum):
    PENDING = "pending"
    """Not started: the next step is the first assistant turn."""
    GENERATING = "generating"
    """An assistant turn is being decoded (tokens so far in response_ids[turn_start:])."""
    PROCESSING_TOOLS = "processing_tools"
    """The turn ended with tool calls (``pending_calls``); their results are awaited."""
    INTERACTING = "interacting"
    """The turn ended with an answer and an interaction (a simulated user) replies."""
    TERMINATED = "terminated"
    """Done: ``finish_reason`` says why."""


@dataclass
class AgentState:
    prompt_ids: list[int]
    phase: Phase = Phase.PENDING
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    """The conversation after the prompt: {"role": "assistant"|"tool"|"user", "content"}."""
    turn_start: int = 0
    assistant_turns: int = 0
    user_turns: int = 0
    """Rounds of tool responses and interaction replies (verl's user turns)."""
    pending_calls: list[dict[str, Any]] = field(default_factory=list)
    """Tool calls of the last turn not answered yet (ToolCall.to_dict())."""
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    """Wall time of this trajectory's tool calls, summed."""
    finish_reason: str = ""
    """stop (answered), length (response_length reached), max_turns (turn limit),
    interaction_error (the interaction raised: the trajectory ends as it stood)."""
    prompt_messages: list[dict[str, Any]] = field(default_factory=list)
    """With an interaction: the prompt as messages, which its ``messages`` begin with (verl's);
    else empty (nothing more to log in partials)."""
    interaction_kwargs: dict[str, Any] = field(default_factory=dict)
    """With an interaction: the sample's ``extra_info.interaction_kwargs`` (``name`` picks
    the interaction)."""
    turn_scores: list[float] = field(default_factory=list)
    """The interaction's score of each reply, when it gave one (verl's ``turn_scores``)."""

    @property
    def num_turns(self) -> int:
        """Messages after the prompt: assistant turns, tool responses and user replies."""
        return len(self.messages)

    def check(self) -> None:
        """The token lists line up (raises ValueError: a bug, or a corrupt partial)."""
        n = len(self.response_ids)
        if len(self.response_mask) != n or len(self.response_logprobs) != n:
            raise ValueError(
                f"agent state: {n} ids, {len(self.response_mask)} mask, "
                f"{len(self.response_logprobs)} logprobs"
            )
        if not 0 <= self.turn_start <= n:
            raise ValueError(f"agent state: turn_start {self.turn_start} outside 0..{n}")

    def to_json(self) -> str:
        d = asdict(self)
        d["phase"] = str(self.phase)
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> AgentState:
        d = json.loads(text)
        d["phase"] = Phase(d["phase"])
        state = cls(**d)
        state.check()
        return state
