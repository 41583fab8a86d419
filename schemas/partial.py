"""An interrupted sample on the ``partials`` topic: what a sync cut short, to be continued.

In mode (d) a sync interrupts every in-flight sample between two tokens. The worker publishes
one message per interrupted sample before it pauses: one row per trajectory, the finished
ones (finish_reason ``stop``/``length``, with their reward) and the interrupted ones
(``abort``: tokens and logprobs so far, their segments and versions). Together with the prompt's
coordinates this is everything needed to continue the sample later, in this worker after the
sync, or in a restarted worker after a crash, and to replay how a trajectory grew across
weight versions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from asyncrl.schemas.codec import DecodeError, decode_batch, encode_batch, schema_tag, with_tag
from asyncrl.schemas.sample import SCHEMA as SAMPLE_SCHEMA
from asyncrl.schemas.sample import Sample, sample_columns, sample_from_batch, validate

NAME = "partial"
VERSION = 4
TAG = schema_tag(NAME, VERSION)

_EXTRA = [
    pa.field("agent_state", pa.string(), nullable=False),
    pa.field("interrupted_at_version", pa.int64(), nullable=False),
    pa.field("prompt_partition", pa.int32(), nullable=False),
    pa.field("prompt_offset", pa.int64(), nullable=False),
    pa.field("epoch", pa.int32(), nullable=False),
]
SCHEMA = with_tag(pa.schema([*SAMPLE_SCHEMA.remove_metadata(), *_EXTRA]), NAME, VERSION)


@dataclass
class PartialSample:
    """A sample cut short by the sync to ``interrupted_at_version``."""

    sample: Sample
    interrupted_at_version: int
    prompt_partition: int
    prompt_offset: int
    epoch: int = 0
    agent_state: list[str] = field(default_factory=list)
    """Opaque per-trajectory state of a multi-turn agent (JSON); empty strings for one turn."""

    def __post_init__(self) -> None:
        if not self.agent_state:
            self.agent_state = [""] * len(self.sample.trajectories)

    @property
    def interrupted(self) -> list[int]:
        """Indices of the trajectories that were cut short (the rest had finished)."""
        return [i for i, t in enumerate(self.sample.trajectories) if t.finish_reason == "abort"]


def encode_partial(p: PartialSample) -> bytes:
    validate(p.sample)
    if len(p.agent_state) != len(p.sample.trajectories):
        raise DecodeError(f"partial {p.sample.sample_id}: one agent_state per trajectory")
    n = len(p.sample.trajectories)
    cols = sample_columns(p.sample)
    cols.update(
        agent_state=p.agent_state,
        interrupted_at_version=[p.interrupted_at_version] * n,
        prompt_partition=[p.prompt_partition] * n,
        prompt_offset=[p.prompt_offset] * n,
        epoch=[p.epoch] * n,
    )
    return encode_batch(pa.RecordBatch.from_pydict(cols, schema=SCHEMA))


def decode_partial(data: bytes | None, headers: dict[str, bytes] | None = None) -> PartialSample:
    batch = decode_batch(data, SCHEMA, TAG, headers)
    sample = sample_from_batch(batch, TAG)
    cols = batch.select([f.name for f in _EXTRA]).to_pydict()
    return PartialSample(
        sample=sample,
        interrupted_at_version=cols["interrupted_at_version"][0],
        prompt_partition=cols["prompt_partition"][0],
        prompt_offset=cols["prompt_offset"][0],
        epoch=cols["epoch"][0],
        agent_state=cols["agent_state"],
    )
