"""An example interaction (a simulated user) to copy: it tells the model whether its answer
was right and lets it try again, ``max_retries`` times (default 1).

Configured as verl configures interactions (``multi_turn.interaction_config_path``; the
shipped ``asyncrl/configs/interactions/retry.yaml``)::

    interaction:
      - name: retry
        class_name: asyncrl.producers.agent.retry_interaction.RetryInteraction
        config: {max_retries: 1}

and each data row names it with its answer (``extra_info.interaction_kwargs``, as verl's
gsm8k example does): ``{"name": "retry", "ground_truth": "29842"}``.

It keeps no state per trajectory: the retries it granted are its own replies in the messages
it is shown (not the assistant messages: a turn that calls a tool is one too, and counting them
left a model that used the calculator no retry), so a trajectory that a sync moves to another
worker is answered the same there.
"""

from __future__ import annotations

import re
from typing import Any

from asyncrl.producers.agent.interaction import Interaction

TRY_AGAIN = "Your answer is incorrect. Try again."
"""The reply that grants a retry (what :meth:`RetryInteraction.generate_response` counts)."""
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def is_right(answer: str, ground_truth: str) -> bool:
    """The answer's last number is the ground truth (commas ignored), or, for an answer with
    no number, the whole answer is."""
    numbers = _NUMBER.findall(answer)
    said = numbers[-1].replace(",", "") if numbers else answer.strip()
    return said == str(ground_truth).strip()


class RetryInteraction(Interaction):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.max_retries = int(config.get("max_retries", 1))
        if self.max_retries < 0:
            raise ValueError(f"config.max_retries must be >= 0, not {self.max_retries}")

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        if "ground_truth" not in kwargs:
            raise ValueError("interaction_kwargs has no ground_truth")
        answers = [m["content"] for m in messages if m.get("role") == "assistant"]
        retries = sum(m.get("role") == "user" and m.get("content") == TRY_AGAIN for m in messages)
        attempts = retries + 1
        if answers and is_right(answers[-1], kwargs["ground_truth"]):
            return True, "Your answer is correct.", 1.0, {"attempts": attempts}
        if retries >= self.max_retries:
            return True, "Your answer is incorrect.", 0.0, {"attempts": attempts}
        return False, TRY_AGAIN, 0.0, {"attempts": attempts}
