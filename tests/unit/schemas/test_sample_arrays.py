"""Token columns as numpy arrays from the worker's trajectory to the trainer's tensors: the wire
round trip keeps the column types and reads without copying, zero-length trajectories survive,
a malformed message is a DecodeError (dead-lettered, not a crash in the trainer), and the
trainer's padded tensors are the same from arrays as from lists."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from asyncrl.config import load_config
from asyncrl.consumers.grpo import build_batch
from asyncrl.consumers.update import data_metrics
from asyncrl.schemas import DecodeError
from asyncrl.schemas.codec import encode_batch
from asyncrl.schemas.partial import PartialSample, decode_partial, encode_partial
from asyncrl.schemas.sample import (
    SCHEMA,
    Sample,
    Trajectory,
    decode_sample,
    encode_sample,
    sample_columns,
)


def _sample(lengths: tuple[int, ...] = (5, 0, 300), seed: int = 0) -> Sample:
    rng = np.random.default_rng(seed)
    trajs = [
        Trajectory(
            response_ids=rng.integers(0, 50_000, n, dtype=np.int32),
            response_logprobs=-rng.random(n, dtype=np.float32),
            response_mask=(rng.random(n) < 0.8).astype(np.int8),
            reward=float(i),
            finish_reason="stop" if n else "abort",
        )
        for i, n in enumerate(lengths)
    ]
    return Sample("s@0", "s", 1, rng.integers(0, 50_000, 7, dtype=np.int32), "3", trajs)


def test_decoded_token_columns_are_read_only_views_of_the_message_with_their_types():
    s = _sample()
    data = encode_sample(s)
    back = decode_sample(data)
    assert back == s
    assert back.prompt_ids.dtype == np.int32 and back.prompt_ids.tolist() == s.prompt_ids.tolist()
    for got, sent in zip(back.trajectories, s.trajectories, strict=True):
        assert got.response_ids.dtype == np.int32
        assert got.response_logprobs.dtype == np.float32
        assert got.response_mask.dtype == np.int8
        assert np.array_equal(got.response_logprobs, sent.response_logprobs)  # bit for bit
        assert not got.response_ids.flags.writeable  # a view of the message, not a copy
    first, last = back.trajectories[0].response_ids, back.trajectories[2].response_ids
    assert first.base is not None and first.base is last.base  # slices of the column's values


def test_zero_length_trajectories_round_trip_in_a_sample_and_a_partial():
    s = _sample((0, 0))  # every trajectory aborted before its first token
    back = decode_sample(encode_sample(s))
    assert back == s
    for t in back.trajectories:
        assert len(t.response_ids) == len(t.response_logprobs) == len(t.response_mask) == 0
        assert t.response_ids.dtype == np.int32 and t.token_versions().tolist() == []
    p = PartialSample(
        _sample((4, 0)), interrupted_at_version=0, prompt_partition=0, prompt_offset=3
    )
    assert decode_partial(encode_partial(p)) == p


def test_lists_given_to_a_trajectory_become_arrays_of_the_column_type():
    t = Trajectory(response_ids=[5, 6, 2], response_logprobs=[-0.1, -0.2, -0.3], reward=1.0)
    assert t.response_ids.dtype == np.int32 and t.response_logprobs.dtype == np.float32
    assert t.response_mask.tolist() == [1, 1, 1] and t.response_mask.dtype == np.int8
    assert t.response_logprobs.tolist() == np.array([-0.1, -0.2, -0.3], np.float32).tolist()
    assert Sample("a", "a", 0, [1, 2], "", [t]).prompt_ids.dtype == np.int32
    with pytest.raises(OverflowError):
        Trajectory(response_ids=[2**31], response_logprobs=[0.0], reward=0.0)
    with pytest.raises(ValueError, match="one dimension"):
        Trajectory(response_ids=[[1, 2]], response_logprobs=[[0.0, 0.0]], reward=0.0)


def test_equality_compares_token_arrays_by_value():
    a, b = _sample(), _sample()
    assert a == b
    b.trajectories[2].response_ids = b.trajectories[2].response_ids.copy()
    b.trajectories[2].response_ids[-1] += 1
    assert a != b
    assert a != _sample(seed=1)


def _from_lists() -> Sample:
    trajs = [Trajectory([5, 6, 2], [-0.5, -0.25, -0.125], 0.0), Trajectory([1, 2], [-0.5] * 2, 1.0)]
    return Sample("s@0", "s", 1, [1, 2], "3", trajs)


def _with_column(name: str, values: pa.Array) -> bytes:
    cols = sample_columns(_from_lists())
    cols[name] = values
    return encode_batch(pa.RecordBatch.from_pydict(cols, schema=SCHEMA))


@pytest.mark.parametrize(
    "name, values, match",
    [
        ("response_ids", pa.array([[5, None, 2], [1, 2]], pa.list_(pa.int32())), "null value"),
        ("response_mask", pa.array([[1, 1, 1], None], pa.list_(pa.int8())), "non-nullable"),
        ("reward", pa.array([None, 1.0], pa.float32()), "non-nullable"),
    ],
    ids=["null-token", "null-row", "null-reward"],
)
def test_a_sample_with_nulls_is_a_decode_error(name, values, match):
    """Before, these decoded: a None among the tokens or as the reward (the trainer failed on
    it), a null mask read as all ones. Now a DecodeError: the reader dead-letters them."""
    with pytest.raises(DecodeError, match=match):
        decode_sample(_with_column(name, values))


def test_a_sample_whose_offsets_point_past_its_tokens_is_a_decode_error():
    """Before, decoding read past the column's values (memory outside the message)."""
    data = encode_sample(_from_lists())
    offsets = np.array([0, 3, 5], np.int32).tobytes()  # response_ids' (the first such run)
    at = data.index(offsets)
    bad = data[:at] + np.array([0, 3, 1000], np.int32).tobytes() + data[at + len(offsets) :]
    with pytest.raises(DecodeError, match="invalid Arrow data"):
        decode_sample(bad)


def test_the_trainers_tensors_from_decoded_arrays_equal_those_from_lists():
    s = decode_sample(encode_sample(_sample()))
    rows = [(s.prompt_ids, t.response_ids, t.response_logprobs, 0.5) for t in s.trajectories]
    lists = [(p.tolist(), r.tolist(), lp.tolist(), a) for p, r, lp, a in rows]
    got, want = build_batch(rows, pad_token_id=0), build_batch(lists, pad_token_id=0)
    for name in got.__dataclass_fields__:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert got.input_ids.dtype == torch.long and got.old_logprobs.dtype == torch.float32


def test_step_metrics_count_masks_past_the_int8_range():
    s = _sample((300, 300))
    s.trajectories[0].response_mask = np.ones(300, np.int8)
    s.trajectories[1].response_mask = np.repeat(np.array([1, 0], np.int8), [100, 200])
    metrics = data_metrics([s], torch.tensor([[1.0, -1.0]]), load_config())
    assert metrics["critic/advantages/mean"] == (300 - 100) / 400  # tokens trained, weighted
    assert metrics["response_length/mean"] == 300.0
