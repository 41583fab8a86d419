"""The wire contract: round trips, validation, and the pyarrow-only import rule."""

import subprocess
import sys

import pyarrow as pa
import pytest

from asyncrl.schemas import DecodeError
from asyncrl.schemas import control as ev
from asyncrl.schemas.codec import encode_batch
from asyncrl.schemas.prompt import PromptRecord, decode_prompt, encode_prompt
from asyncrl.schemas.sample import SCHEMA, Sample, Trajectory, decode_sample, encode_sample
from asyncrl.schemas.step import StepRecord, decode_step, encode_step


def make_sample(n: int = 3, version: int = 2) -> Sample:
    trajs = [
        Trajectory(
            response_ids=[5 + i, 6, 2],
            response_logprobs=[-0.5, -0.25, -0.125],
            reward=float(i % 2),
            param_version=version,
            param_version_start=version - 1,
            t_start=1.0,
            t_end=2.0,
        )
        for i in range(n)
    ]
    return Sample("add-1-2@0", "add-1-2", 0, [1, 7, 8, 9], "3", trajs)


def test_sample_round_trip_keeps_every_field():
    s = make_sample()
    back = decode_sample(encode_sample(s))
    assert back == s
    assert back.param_version == 1 and back.param_version_end == 2
    assert back.trajectories[0].response_mask.tolist() == [1, 1, 1]


def test_sample_metadata_carries_schema_tag():
    reader = pa.ipc.open_stream(pa.py_buffer(encode_sample(make_sample())))
    assert reader.schema.metadata[b"asyncrl.schema"] == b"sample/5"


def test_turn_scores_travel_with_their_trajectory():
    """An interaction's turn_scores survive the wire."""
    s = make_sample()
    s.trajectories[1].turn_scores = [0.0, 0.5, 1.0]
    assert decode_sample(encode_sample(s)) == s


def test_a_reward_failure_travels_with_its_trajectory():
    s = make_sample()
    s.trajectories[1].reward_error = "ZeroDivisionError: division by zero"
    s.trajectories[2].reward_extra = '{"acc": 1.0}'
    back = decode_sample(encode_sample(s))
    assert back == s
    assert [t.reward_failed for t in back.trajectories] == [False, True, False]


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "empty"),
        (b"not arrow at all", "not an Arrow IPC stream"),
        (encode_prompt(PromptRecord("p", "1+1=", "2")), "expected schema sample/5"),
    ],
)
def test_sample_rejects_bad_bytes(data, match):
    with pytest.raises(DecodeError, match=match):
        decode_sample(data)


def test_sample_rejects_misaligned_logprobs():
    s = make_sample()
    s.trajectories[1].response_logprobs = [-1.0]
    with pytest.raises(DecodeError, match="same length"):
        encode_sample(s)
    # The same defect arriving over the wire (built without our encoder) is caught on decode.
    cols = {name: [] for name in SCHEMA.names}
    row = dict(
        sample_id="x",
        prompt_id="x",
        traj_index=0,
        worker_id=0,
        prompt_ids=[1],
        response_ids=[1, 2],
        response_logprobs=[-1.0],
        response_mask=[1, 1],
        reward=0.0,
        finish_reason="stop",
        param_version=0,
        param_version_start=0,
        segment_starts=[0],
        segment_versions=[0],
        ground_truth="1",
        t_start=0.0,
        t_end=0.0,
        reward_s=0.0,
        num_turns=0,
        tool_calls=0,
        tool_errors=0,
        tool_s=0.0,
        reward_error="",
        reward_extra="",
        turn_scores=[],
    )
    for k, v in row.items():
        cols[k].append(v)
    data = encode_batch(pa.RecordBatch.from_pydict(cols, schema=SCHEMA))
    with pytest.raises(DecodeError, match="same length"):
        decode_sample(data)


def test_segments_of_a_partial_trajectory_round_trip():
    s = make_sample()
    t = s.trajectories[0]
    t.response_ids, t.response_logprobs, t.response_mask = [5, 6, 7, 2], [-1.0] * 4, [1] * 4
    t.param_version_start, t.param_version = 3, 5
    t.segment_starts, t.segment_versions = [0, 1, 3], [3, 4, 5]
    back = decode_sample(encode_sample(s)).trajectories[0]
    assert (back.segment_starts, back.segment_versions) == ([0, 1, 3], [3, 4, 5])
    assert back.token_versions().tolist() == [3, 4, 4, 5]
    assert back.span == 2


@pytest.mark.parametrize(
    "starts, versions",
    [([1, 3], [3, 5]), ([0, 3], [3, 4]), ([0, 3, 2], [3, 4, 5]), ([0, 9], [3, 5])],
    ids=["not-from-0", "last-version-wrong", "backwards", "past-the-end"],
)
def test_inconsistent_segments_are_rejected(starts, versions):
    s = make_sample()
    t = s.trajectories[0]
    t.response_ids, t.response_logprobs, t.response_mask = [5, 6, 7, 2], [-1.0] * 4, [1] * 4
    t.param_version_start, t.param_version = 3, 5
    t.segment_starts, t.segment_versions = starts, versions
    with pytest.raises(DecodeError, match="bad segments"):
        encode_sample(s)


def test_prompt_and_step_round_trip():
    p = PromptRecord("add-3-4", "3+4=", "7", epoch=2)
    assert decode_prompt(encode_prompt(p)) == p
    assert p.sample_id == "add-3-4@2"
    assert p.chat() is None and p.reward_extra_info() == {} and p.reward_ground_truth() == "7"
    rec = StepRecord("r", 3, 1, 12.5, ["a@0", "b@0"], [0, 0], [10, 11], {"loss": 0.5}, "abc")
    assert decode_step(encode_step(rec)) == rec


@pytest.mark.parametrize("cls", sorted(ev.ControlEvent.registry.values(), key=lambda c: c.__name__))
def test_every_control_event_round_trips(cls):
    event = cls(run_id="r", version=4, worker=1)
    headers = {"asyncrl-schema": event.tag().encode()}
    assert ev.decode_event(ev.encode_event(event), headers) == event
    assert ev.decode_event(ev.encode_event(event)) == event  # from Arrow metadata alone


def test_control_event_with_map_and_unknown_tag():
    e = ev.SyncRequested(run_id="r", version=2, step=8, consumed={"0": 12, "1": 3})
    assert ev.decode_event(ev.encode_event(e)).consumed == {"0": 12, "1": 3}
    with pytest.raises(DecodeError, match="unknown control event"):
        ev.decode_event(ev.encode_event(e), {"asyncrl-schema": b"control.Nope/1"})
    with pytest.raises(DecodeError, match="expected schema"):
        ev.decode_event(ev.encode_event(e), {"asyncrl-schema": b"control.RunFinished/1"})


def test_schemas_import_without_torch():
    code = "import sys, asyncrl.schemas; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_partial_round_trip_keeps_finished_and_interrupted_trajectories():
    from asyncrl.schemas.partial import PartialSample, decode_partial, encode_partial

    s = make_sample(n=2, version=4)
    cut = s.trajectories[1]
    cut.finish_reason, cut.reward = "abort", 0.0
    p = PartialSample(s, interrupted_at_version=4, prompt_partition=2, prompt_offset=17, epoch=1)
    back = decode_partial(encode_partial(p))
    assert back == p
    assert back.interrupted == [1]
    assert back.agent_state == ["", ""]


def test_a_schema_header_that_contradicts_the_message_is_rejected():
    from asyncrl.schemas import SCHEMA_HEADER
    from asyncrl.schemas.sample import TAG

    data = encode_sample(make_sample())
    assert decode_sample(data, {SCHEMA_HEADER: TAG.encode()}).sample_id == "add-1-2@0"
    assert decode_sample(data, {}).sample_id == "add-1-2@0"  # no header: the Arrow tag decides
    with pytest.raises(DecodeError, match="sample/99"):
        decode_sample(data, {SCHEMA_HEADER: b"sample/99"})
    prompt = encode_prompt(PromptRecord("p1", "1+1=", "2", 0))
    with pytest.raises(DecodeError, match="header"):
        decode_prompt(prompt, {SCHEMA_HEADER: TAG.encode()})
    event = ev.RunFinished(run_id="r", version=1)
    with pytest.raises(DecodeError):
        ev.decode_event(ev.encode_event(event), {SCHEMA_HEADER: b"control.RunFinished/1"})


def test_a_chat_prompt_carries_what_its_reward_needs():
    p = PromptRecord(
        "train-3",
        "3+4=",
        '["7"]',
        epoch=1,
        data_source="my_math",
        messages='[{"role": "user", "content": "3+4="}]',
        extra_info='{"index": 3, "split": "train"}',
        ground_truth_json=True,
    )
    back = decode_prompt(encode_prompt(p))
    assert back == p
    assert back.chat() == [{"role": "user", "content": "3+4="}]
    assert back.reward_ground_truth() == ["7"]
    assert back.reward_extra_info() == {"index": 3, "split": "train"}


def test_a_sample_an_update_would_fail_on_is_refused_as_it_is_read():
    """A schema-valid sample with a NaN reward or logprob or a negative token id went into the
    update: NaN weights, or an index error, at every try (a restarted trainer read it again).
    It is now undecodable, so the trainer's reader dead-letters it and goes on."""
    from asyncrl.schemas.sample import sample_columns

    def sample(reward=1.0, logprob=-0.5, token=5) -> Sample:
        t = Trajectory([4, token], [-0.1, logprob], reward)
        return Sample("s@0", "s", 0, [1, 2], "3", [t])

    good = encode_sample(sample())
    assert decode_sample(good).trajectories[0].reward == 1.0
    for bad, why in (
        ({"reward": float("nan")}, "not finite"),
        ({"logprob": float("-inf")}, "not finite"),
        ({"token": -3}, "negative token id"),
    ):
        with pytest.raises(DecodeError, match=why):
            encode_sample(sample(**bad))  # a worker cannot publish it either
        forged = sample_columns(sample(**bad))  # written by something else than encode_sample
        record = encode_batch(pa.RecordBatch.from_pydict(forged, schema=SCHEMA))
        with pytest.raises(DecodeError, match=why):
            decode_sample(record)
