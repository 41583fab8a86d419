"""A dataset prompt on the ``prompts`` topic; its committed offset is the data-loader position."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from asyncrl.schemas.codec import DecodeError, decode_batch, encode_batch, schema_tag, with_tag

NAME = "prompt"
VERSION = 1
TAG = schema_tag(NAME, VERSION)

SCHEMA = with_tag(
    pa.schema(
        [
            pa.field("prompt_id", pa.string(), nullable=False),
            pa.field("prompt", pa.string(), nullable=False),
            pa.field("ground_truth", pa.string(), nullable=False),
            pa.field("epoch", pa.int32(), nullable=False),
            pa.field("data_source", pa.string(), nullable=False),
        ]
    ),
    NAME,
    VERSION,
)


@dataclass(frozen=True)
class PromptRecord:
    prompt_id: str
    prompt: str
    ground_truth: str
    epoch: int = 0
    data_source: str = "arithmetic"

    @property
    def sample_id(self) -> str:
        """Sample ids are unique per epoch, so a prompt seen twice yields two samples."""
        return f"{self.prompt_id}@{self.epoch}"


def encode_prompt(p: PromptRecord) -> bytes:
    cols = {f: [getattr(p, f)] for f in SCHEMA.names}
    return encode_batch(pa.RecordBatch.from_pydict(cols, schema=SCHEMA))


def decode_prompt(data: bytes | None, headers: dict[str, bytes] | None = None) -> PromptRecord:
    batch = decode_batch(data, SCHEMA, TAG, headers=headers)
    if batch.num_rows != 1:
        raise DecodeError(f"{TAG}: expected 1 row, got {batch.num_rows}")
    row = batch.to_pylist()[0]
    return PromptRecord(**row)
