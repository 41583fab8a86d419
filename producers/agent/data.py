"""The data files' prompts as the agent loop reads them.

``asyncrl.tasks.files`` reads and checks the rows, a layer below the tools and interactions:
here its two calls get what the run's tool and interaction configs add, so every reader
(the set-up's feed, the trainer's feed, the held-out set, the start-up checks) counts a
prompt's tokens as a worker's chat template writes them (with the tools' schemas) and
refuses a row that picks no configured interaction.
"""

from __future__ import annotations

from typing import Any

from asyncrl.config import RunConfig
from asyncrl.producers.agent.interaction import run_interaction_names
from asyncrl.producers.tools.registry import prompt_tool_schemas
from asyncrl.tasks import files


def checked_rows(cfg: RunConfig, split: str) -> list[files.DataRow]:
    """:func:`asyncrl.tasks.files.checked_rows`, each row picking one of the run's
    interactions (if it has any)."""
    return files.checked_rows(cfg, split, run_interaction_names(cfg))


def load_split(
    cfg: RunConfig, split: str, tokenizer: Any, rows: list[files.DataRow] | None = None
) -> files.Split:
    """:func:`asyncrl.tasks.files.load_split`, the length filter counting the run's tools'
    schemas (what the workers' chat template writes)."""
    rows = checked_rows(cfg, split) if rows is None else rows
    return files.load_split(cfg, split, tokenizer, rows, prompt_tool_schemas(cfg))
