"""``asyncrl inspect samples`` and ``partials``: the per-trajectory lists line up with the
trajectories and show what the agent loop recorded."""

from __future__ import annotations

from asyncrl.kafka.record import Record
from asyncrl.ops.inspect_log import _partial_row, _sample_row
from asyncrl.producers.agent.state import AgentState, Phase
from asyncrl.schemas.partial import PartialSample, encode_partial
from asyncrl.schemas.sample import Sample, Trajectory, encode_sample


def test_agent_phases_line_up_with_the_trajectories_when_some_had_finished() -> None:
    """The phases were listed for the interrupted trajectories only: with trajectory 0
    finished, trajectory 1's phase showed under trajectory 0."""
    finished = Trajectory([5, 6], [-0.1, -0.2], 1.0, "stop")
    cut = Trajectory([7], [-0.3], 0.0, "abort")
    sample = Sample("s", "p", 0, [1, 2], "42", [finished, cut, cut])
    states = [
        "",  # finished: no agent state
        AgentState([1, 2], phase=Phase.INTERACTING).to_json(),
        AgentState([1, 2], phase=Phase.GENERATING).to_json(),
    ]
    partial = PartialSample(sample, 3, 0, 9, agent_state=states)
    rec = Record("r.partials", 0, 4, "s", 1_700_000_000_000, {}, encode_partial(partial))
    row = _partial_row(rec, None, None)
    assert (row["finished"], row["interrupted"]) == (1, 2)
    assert row["agent_phases"] == [None, "interacting", "generating"]
    assert len(row["agent_phases"]) == len(row["segments"])


def test_an_interactions_turn_scores_show_per_trajectory() -> None:
    """verl keeps an interaction's score of each reply (turn_scores); asyncrl dropped them."""
    scored = Trajectory([5, 6], [-0.1, -0.2], 1.0, "stop", num_turns=4, turn_scores=[0.0, 1.0])
    plain = Trajectory([7], [-0.3], 0.0, "stop", num_turns=2)
    sample = Sample("s", "p", 0, [1, 2], "42", [scored, plain])
    rec = Record("r.samples", 0, 4, "s", 1_700_000_000_000, {}, encode_sample(sample))
    assert _sample_row(rec, None, {})["turn_scores"] == [[0.0, 1.0], []]
    partial = PartialSample(sample, 3, 0, 9)
    rec = Record("r.partials", 0, 4, "s", 1_700_000_000_000, {}, encode_partial(partial))
    assert _partial_row(rec, None, None)["turn_scores"] == [[0.0, 1.0], []]
    sample.trajectories = [plain]  # none scored: no column
    rec = Record("r.samples", 0, 5, "s", 1_700_000_000_000, {}, encode_sample(sample))
    assert "turn_scores" not in _sample_row(rec, None, {})
