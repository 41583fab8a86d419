"""One training step on the ``steps`` topic: which samples formed it, at which version, and
what it measured. This is the record a replay of step N starts from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from asyncrl.schemas.codec import DecodeError, decode_batch, encode_batch, schema_tag, with_tag

NAME = "step"
VERSION = 1
TAG = schema_tag(NAME, VERSION)

SCHEMA = with_tag(
    pa.schema(
        [
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("step", pa.int64(), nullable=False),
            pa.field("version", pa.int64(), nullable=False),
            pa.field("ts", pa.float64(), nullable=False),
            pa.field("sample_ids", pa.list_(pa.string()), nullable=False),
            pa.field("partitions", pa.list_(pa.int32()), nullable=False),
            pa.field("offsets", pa.list_(pa.int64()), nullable=False),
            pa.field("metrics", pa.map_(pa.string(), pa.float64()), nullable=False),
            pa.field("weights_checksum", pa.string(), nullable=False),
        ]
    ),
    NAME,
    VERSION,
)


@dataclass
class StepRecord:
    run_id: str
    step: int
    version: int
    ts: float
    sample_ids: list[str]
    partitions: list[int]
    offsets: list[int]
    metrics: dict[str, float] = field(default_factory=dict)
    weights_checksum: str = ""
    """Checksum of the weights the step started from ('' when not computed)."""


def encode_step(rec: StepRecord) -> bytes:
    if not len(rec.sample_ids) == len(rec.partitions) == len(rec.offsets):
        raise ValueError("sample_ids, partitions and offsets must have the same length")
    cols = {name: [getattr(rec, name)] for name in SCHEMA.names}
    cols["metrics"] = [list(rec.metrics.items())]
    return encode_batch(pa.RecordBatch.from_pydict(cols, schema=SCHEMA))


def decode_step(data: bytes | None, headers: dict[str, bytes] | None = None) -> StepRecord:
    batch = decode_batch(data, SCHEMA, TAG, headers=headers)
    if batch.num_rows != 1:
        raise DecodeError(f"{TAG}: expected 1 row, got {batch.num_rows}")
    row = batch.to_pylist()[0]
    row["metrics"] = dict(row["metrics"])
    return StepRecord(**row)
