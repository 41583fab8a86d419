"""A dataset prompt on the ``prompts`` topic; its committed offset is the data-loader position.

A prompt is plain text (``prompt``, the built-in tasks) or chat messages (``messages``, JSON:
``[{"role": ..., "content": ...}]``, verl's format, tokenized through the chat template). It
carries what the reward needs: ``data_source``, ``ground_truth`` (text; JSON when
``ground_truth_json``, for a verl dataset whose ground truth is a list or a mapping) and
``extra_info`` (a JSON object, or empty).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from asyncrl.schemas.codec import DecodeError, decode_batch, encode_batch, schema_tag, with_tag

NAME = "prompt"
VERSION = 2
TAG = schema_tag(NAME, VERSION)

SCHEMA = with_tag(
    pa.schema(
        [
            pa.field("prompt_id", pa.string(), nullable=False),
            pa.field("prompt", pa.string(), nullable=False),
            pa.field("ground_truth", pa.string(), nullable=False),
            pa.field("epoch", pa.int32(), nullable=False),
            pa.field("data_source", pa.string(), nullable=False),
            pa.field("messages", pa.string(), nullable=False),
            pa.field("extra_info", pa.string(), nullable=False),
            pa.field("ground_truth_json", pa.bool_(), nullable=False),
        ]
    ),
    NAME,
    VERSION,
)


@dataclass(frozen=True)
class PromptRecord:
    prompt_id: str
    prompt: str
    """The prompt text; for a chat prompt, its last message's content (for display)."""
    ground_truth: str
    epoch: int = 0
    data_source: str = "arithmetic"
    messages: str = ""
    """Chat messages as JSON, or empty for a plain-text prompt."""
    extra_info: str = ""
    """verl's extra_info as a JSON object, or empty."""
    ground_truth_json: bool = False
    """``ground_truth`` is JSON (verl's ground truth was not a string)."""

    @property
    def sample_id(self) -> str:
        """Sample ids are unique per epoch, so a prompt seen twice yields two samples."""
        return f"{self.prompt_id}@{self.epoch}"

    def chat(self) -> list[dict[str, Any]] | None:
        """The chat messages, or None for a plain-text prompt."""
        return json.loads(self.messages) if self.messages else None

    def reward_ground_truth(self) -> Any:
        """The ground truth as the dataset held it (a string, or a decoded JSON value)."""
        return json.loads(self.ground_truth) if self.ground_truth_json else self.ground_truth

    def reward_extra_info(self) -> dict[str, Any]:
        return json.loads(self.extra_info) if self.extra_info else {}


def encode_prompt(p: PromptRecord) -> bytes:
    cols = {f: [getattr(p, f)] for f in SCHEMA.names}
    return encode_batch(pa.RecordBatch.from_pydict(cols, schema=SCHEMA))


def decode_prompt(data: bytes | None, headers: dict[str, bytes] | None = None) -> PromptRecord:
    batch = decode_batch(data, SCHEMA, TAG, headers)
    if batch.num_rows != 1:
        raise DecodeError(f"{TAG}: expected 1 row, got {batch.num_rows}")
    row = batch.to_pylist()[0]
    for key in ("messages", "extra_info", "ground_truth"):
        if row[key] and (key != "ground_truth" or row["ground_truth_json"]):
            try:
                json.loads(row[key])
            except ValueError as err:
                raise DecodeError(f"{TAG}: {key} is not JSON ({err})") from None
    return PromptRecord(**row)
