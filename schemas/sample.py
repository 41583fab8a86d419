"""A finished sample: one prompt's group of ``rollout.n`` trajectories, one Kafka message.

The group travels together because GRPO's advantage is relative within the group. One row per
trajectory. The token columns (``prompt_ids``, ``response_ids``, ``response_logprobs``,
``response_mask``) are Arrow lists, held in memory as numpy arrays of the column's type
(``TOKEN_DTYPES``) from the worker to the trainer's tensors: encoding builds the Arrow lists
from the arrays (one concatenation per column), decoding hands out read-only numpy views of the
message's own buffer, without a Python list on either side.
``param_version`` is the weight version the last token was generated under;
``param_version_start`` the version of the first token (they differ for partial rollouts).
``segment_starts``/``segment_versions`` list every segment of a trajectory interrupted by
syncs: the response index where it begins and the weight version its tokens came from.
``reward_error`` is empty when the reward was computed; otherwise it says why the reward
function failed (raised, timed out), ``reward`` is 0 and the trainer does not train on the
trajectory. ``reward_extra`` holds the other numbers a reward function's dict returned (JSON).
``turn_scores`` are the scores an interaction returned with its replies (verl's
``turn_scores``), in order; empty without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from asyncrl.schemas.codec import DecodeError, decode_batch, encode_batch, schema_tag, with_tag

NAME = "sample"
VERSION = 5
TAG = schema_tag(NAME, VERSION)
WORKER_HEADER = "asyncrl-worker"
"""On every ``samples`` message: the producing worker id (read without decoding the sample)."""
NO_SIGNAL_HEADER = "asyncrl-no-signal"
"""On a ``samples`` message whose group dynamic sampling leaves out (every trajectory scored
the same): its worker took the group's budget slot back as it published it, and a restarted
incarnation counts these without decoding them."""

SCHEMA = with_tag(
    pa.schema(
        [
            pa.field("sample_id", pa.string(), nullable=False),
            pa.field("prompt_id", pa.string(), nullable=False),
            pa.field("traj_index", pa.int32(), nullable=False),
            pa.field("worker_id", pa.int32(), nullable=False),
            pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
            pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
            pa.field("response_logprobs", pa.list_(pa.float32()), nullable=False),
            pa.field("response_mask", pa.list_(pa.int8()), nullable=False),
            pa.field("reward", pa.float32(), nullable=False),
            pa.field("finish_reason", pa.string(), nullable=False),
            pa.field("param_version", pa.int64(), nullable=False),
            pa.field("param_version_start", pa.int64(), nullable=False),
            pa.field("segment_starts", pa.list_(pa.int32()), nullable=False),
            pa.field("segment_versions", pa.list_(pa.int64()), nullable=False),
            pa.field("ground_truth", pa.string(), nullable=False),
            pa.field("t_start", pa.float64(), nullable=False),
            pa.field("t_end", pa.float64(), nullable=False),
            pa.field("reward_s", pa.float64(), nullable=False),
            pa.field("num_turns", pa.int32(), nullable=False),
            pa.field("tool_calls", pa.int32(), nullable=False),
            pa.field("tool_errors", pa.int32(), nullable=False),
            pa.field("tool_s", pa.float64(), nullable=False),
            pa.field("reward_error", pa.string(), nullable=False),
            pa.field("reward_extra", pa.string(), nullable=False),
            pa.field("turn_scores", pa.list_(pa.float64()), nullable=False),
        ]
    ),
    NAME,
    VERSION,
)

TokenIds = npt.NDArray[np.int32]
Logprobs = npt.NDArray[np.float32]
Mask = npt.NDArray[np.int8]
TOKEN_DTYPES: dict[str, type[np.generic]] = {
    "prompt_ids": np.int32,
    "response_ids": np.int32,
    "response_logprobs": np.float32,
    "response_mask": np.int8,
}
"""The token columns and the numpy type of each (its Arrow list's value type)."""


def as_tokens(values: Any, name: str) -> np.ndarray:
    """``values`` (a list or an array) as a 1-D array of token column ``name``'s type, without
    a copy if it already is one. Python ints out of the type's range raise (OverflowError)."""
    out = np.asarray(values, dtype=TOKEN_DTYPES[name])
    if out.ndim != 1:
        raise ValueError(f"{name}: expected one dimension, got shape {out.shape}")
    return out


def _fields_equal(a: Trajectory | Sample, b: object) -> bool:
    """Dataclass equality with arrays compared by value (``==`` on arrays is elementwise)."""
    return type(a) is type(b) and all(
        _equal(getattr(a, f.name), getattr(b, f.name)) for f in fields(a)
    )


def _equal(x: Any, y: Any) -> bool:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return bool(np.array_equal(x, y))
    return bool(x == y)


@dataclass(eq=False)
class Trajectory:
    """One response to the prompt, with what the trainer needs to use it off-policy.

    The token fields are numpy arrays (``TOKEN_DTYPES``); lists given to the constructor are
    converted. A decoded trajectory's arrays are read-only views of the message.
    """

    response_ids: TokenIds
    response_logprobs: Logprobs
    reward: float
    finish_reason: str = "stop"
    response_mask: Mask = field(default_factory=lambda: np.zeros(0, np.int8))
    """1 where the token is the model's own (trained on), 0 for a tool's; empty: all 1."""
    param_version: int = 0
    param_version_start: int = 0
    t_start: float = 0.0
    t_end: float = 0.0
    reward_s: float = 0.0
    segment_starts: list[int] = field(default_factory=list)
    """Response index where each segment begins (``[0]`` for an uninterrupted trajectory)."""
    segment_versions: list[int] = field(default_factory=list)
    """Weight version of each segment's tokens; first is param_version_start, last param_version."""
    num_turns: int = 0
    """Messages after the prompt (agent loop: assistant turns, tool responses, user replies)."""
    tool_calls: int = 0
    tool_errors: int = 0
    tool_s: float = 0.0
    """Wall time of this trajectory's tool calls, summed."""
    reward_error: str = ""
    """Why the reward function failed (``reward`` is then 0, not a score); empty: scored."""
    reward_extra: str = ""
    """The reward function's other numbers (a JSON object), or empty."""
    turn_scores: list[float] = field(default_factory=list)
    """The interaction's score of each of its replies (verl's ``turn_scores``): what
    ``generate_response`` returned beside a reply, when it was not None; empty: none."""

    @property
    def reward_failed(self) -> bool:
        return bool(self.reward_error)

    def __post_init__(self) -> None:
        self.response_ids = as_tokens(self.response_ids, "response_ids")
        self.response_logprobs = as_tokens(self.response_logprobs, "response_logprobs")
        self.response_mask = as_tokens(self.response_mask, "response_mask")
        if len(self.response_mask) == 0:
            self.response_mask = np.ones(len(self.response_ids), np.int8)
        if not self.segment_starts:
            self.segment_starts = [0]
            self.segment_versions = [self.param_version_start]
            if self.param_version != self.param_version_start:
                self.segment_starts.append(len(self.response_ids))
                self.segment_versions.append(self.param_version)

    @property
    def span(self) -> int:
        """Weight versions this trajectory's tokens span (0: generated under one version)."""
        return self.param_version - self.param_version_start

    def segments(self) -> list[tuple[int, int, int]]:
        """``(start, end, version)`` of each segment: response tokens ``[start, end)``."""
        bounds = [*self.segment_starts[1:], len(self.response_ids)]
        return list(zip(self.segment_starts, bounds, self.segment_versions, strict=True))

    def token_versions(self) -> npt.NDArray[np.int64]:
        """The weight version of every response token."""
        segs = self.segments()
        return np.repeat(
            np.array([v for _, _, v in segs], np.int64), [end - start for start, end, _ in segs]
        )

    def __eq__(self, other: object) -> bool:
        return _fields_equal(self, other)


@dataclass(eq=False)
class Sample:
    """A prompt and its group of trajectories: the unit the rollout budget counts."""

    sample_id: str
    prompt_id: str
    worker_id: int
    prompt_ids: TokenIds
    """A numpy array (a list given is converted), as the trajectories' token fields."""
    ground_truth: str
    trajectories: list[Trajectory]

    def __post_init__(self) -> None:
        self.prompt_ids = as_tokens(self.prompt_ids, "prompt_ids")

    def __eq__(self, other: object) -> bool:
        return _fields_equal(self, other)

    @property
    def param_version(self) -> int:
        """Oldest weight version any token of the group came from (used for staleness)."""
        return min(t.param_version_start for t in self.trajectories)

    @property
    def param_version_end(self) -> int:
        return max(t.param_version for t in self.trajectories)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]


def validate(sample: Sample) -> None:
    """Reject a sample that would silently corrupt training; raises DecodeError."""
    if not sample.trajectories:
        raise DecodeError(f"sample {sample.sample_id}: no trajectories")
    # Below and in the loop: values one update would turn into NaN weights or an index error;
    # every later step fails, a restarted trainer reads the sample again and fails the same way.
    if len(sample.prompt_ids) and np.min(sample.prompt_ids) < 0:
        raise DecodeError(f"sample {sample.sample_id}: a negative token id in its prompt")
    for i, t in enumerate(sample.trajectories):
        n = len(t.response_ids)
        if len(t.response_logprobs) != n or len(t.response_mask) != n:
            raise DecodeError(
                f"sample {sample.sample_id} trajectory {i}: response_ids ({n}), "
                f"response_logprobs ({len(t.response_logprobs)}) and response_mask "
                f"({len(t.response_mask)}) must have the same length"
            )
        if t.param_version < t.param_version_start or t.param_version_start < 0:
            raise DecodeError(
                f"sample {sample.sample_id} trajectory {i}: bad versions "
                f"{t.param_version_start}..{t.param_version}"
            )
        validate_segments(t, f"sample {sample.sample_id} trajectory {i}")
        if not (np.isfinite(t.reward) and np.isfinite(t.response_logprobs).all()):
            raise DecodeError(
                f"sample {sample.sample_id} trajectory {i}: a reward or logprob is not finite"
            )
        if n and np.min(t.response_ids) < 0:
            raise DecodeError(f"sample {sample.sample_id} trajectory {i}: a negative token id")
        if not all(isinstance(x, float | int) for x in t.turn_scores):
            raise DecodeError(f"sample {sample.sample_id} trajectory {i}: a turn score is null")


def validate_segments(t: Trajectory, where: str) -> None:
    """Segments start at 0, never go backwards, and their versions match the trajectory's."""
    starts, versions = t.segment_starts, t.segment_versions
    ok = (
        len(starts) == len(versions) >= 1
        and starts[0] == 0
        and all(a <= b for a, b in pairwise(starts))
        and starts[-1] <= len(t.response_ids)
        and all(a < b for a, b in pairwise(versions))
        and versions[0] == t.param_version_start
        and versions[-1] == t.param_version
    )
    if not ok:
        raise DecodeError(
            f"{where}: bad segments starts={starts} versions={versions} for "
            f"{len(t.response_ids)} tokens, versions {t.param_version_start}..{t.param_version}"
        )


def sample_columns(sample: Sample) -> dict[str, Any]:
    """One column per SCHEMA field, one row per trajectory (shared by the partials schema):
    the token columns as Arrow list arrays built from the numpy arrays, the others as lists."""
    trajs = sample.trajectories
    n = len(trajs)
    return {
        "sample_id": [sample.sample_id] * n,
        "prompt_id": [sample.prompt_id] * n,
        "traj_index": list(range(n)),
        "worker_id": [sample.worker_id] * n,
        "prompt_ids": token_column([sample.prompt_ids] * n, "prompt_ids"),
        "response_ids": token_column([t.response_ids for t in trajs], "response_ids"),
        "response_logprobs": token_column(
            [t.response_logprobs for t in trajs], "response_logprobs"
        ),
        "response_mask": token_column([t.response_mask for t in trajs], "response_mask"),
        "reward": [t.reward for t in trajs],
        "finish_reason": [t.finish_reason for t in trajs],
        "param_version": [t.param_version for t in trajs],
        "param_version_start": [t.param_version_start for t in trajs],
        "segment_starts": [t.segment_starts for t in trajs],
        "segment_versions": [t.segment_versions for t in trajs],
        "ground_truth": [sample.ground_truth] * n,
        "t_start": [t.t_start for t in trajs],
        "t_end": [t.t_end for t in trajs],
        "reward_s": [t.reward_s for t in trajs],
        "num_turns": [t.num_turns for t in trajs],
        "tool_calls": [t.tool_calls for t in trajs],
        "tool_errors": [t.tool_errors for t in trajs],
        "tool_s": [t.tool_s for t in trajs],
        "reward_error": [t.reward_error for t in trajs],
        "reward_extra": [t.reward_extra for t in trajs],
        "turn_scores": [t.turn_scores for t in trajs],
    }


def token_column(rows: Sequence[Any], name: str) -> pa.ListArray:
    """Token column ``name`` from one array (or list) per row: the rows concatenated once
    into the values and their lengths into the offsets, no Python list of tokens."""
    arrays = [as_tokens(row, name) for row in rows]
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.zeros(0, TOKEN_DTYPES[name])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values))


def token_rows(column: pa.ListArray, name: str, tag: str) -> list[np.ndarray]:
    """The rows of a decoded token column: read-only numpy views of its values, no copy
    (rows themselves null were refused by ``decode_batch``; a null token is refused here)."""
    values = column.values
    if values.null_count:
        raise DecodeError(f"{tag}: {name} holds {values.null_count} null value(s)")
    flat = values.to_numpy(zero_copy_only=True)
    return [flat[a:b] for a, b in pairwise(column.offsets.to_numpy().tolist())]


def encode_sample(sample: Sample) -> bytes:
    validate(sample)
    return encode_batch(pa.RecordBatch.from_pydict(sample_columns(sample), schema=SCHEMA))


def sample_from_batch(batch: pa.RecordBatch, tag: str) -> Sample:
    """Inverse of :func:`sample_columns` (token columns as numpy views of ``batch``, the others
    as Python values); checks the rows form one sample, then validates."""
    n = batch.num_rows
    if n == 0:
        raise DecodeError(f"{tag}: no rows")
    tokens = {name: token_rows(batch.column(name), name, tag) for name in TOKEN_DTYPES}
    cols = batch.select([c for c in batch.schema.names if c not in TOKEN_DTYPES]).to_pydict()
    if len(set(cols["sample_id"])) != 1:
        raise DecodeError(f"{tag}: rows of one message must share a sample_id")
    if cols["traj_index"] != list(range(n)):
        raise DecodeError(f"{tag}: traj_index must be 0..n-1, got {cols['traj_index']}")
    trajs = [
        Trajectory(
            response_ids=tokens["response_ids"][i],
            response_logprobs=tokens["response_logprobs"][i],
            response_mask=tokens["response_mask"][i],
            reward=cols["reward"][i],
            finish_reason=cols["finish_reason"][i],
            param_version=cols["param_version"][i],
            param_version_start=cols["param_version_start"][i],
            segment_starts=cols["segment_starts"][i],
            segment_versions=cols["segment_versions"][i],
            t_start=cols["t_start"][i],
            t_end=cols["t_end"][i],
            reward_s=cols["reward_s"][i],
            num_turns=cols["num_turns"][i],
            tool_calls=cols["tool_calls"][i],
            tool_errors=cols["tool_errors"][i],
            tool_s=cols["tool_s"][i],
            reward_error=cols["reward_error"][i],
            reward_extra=cols["reward_extra"][i],
            turn_scores=cols["turn_scores"][i],
        )
        for i in range(n)
    ]
    sample = Sample(
        sample_id=cols["sample_id"][0],
        prompt_id=cols["prompt_id"][0],
        worker_id=cols["worker_id"][0],
        prompt_ids=tokens["prompt_ids"][0],
        ground_truth=cols["ground_truth"][0],
        trajectories=trajs,
    )
    validate(sample)
    return sample


def decode_sample(data: bytes | None, headers: dict[str, bytes] | None = None) -> Sample:
    return sample_from_batch(decode_batch(data, SCHEMA, TAG, headers), TAG)
