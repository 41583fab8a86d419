"""Your reward (issue 19): verl's ``custom_reward_function`` loads at start-up or the run stops
naming the key; a call that raises or times out is a counted, marked reward failure (never a
silent 0), and the trainer leaves failed trajectories out of the update."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from asyncrl.config import ConfigError, load_config
from asyncrl.consumers.grpo import group_advantages
from asyncrl.consumers.update import grpo_update, reward_metrics, reward_valid
from asyncrl.launch.preflight import check_startable
from asyncrl.producers.reward import (
    BuiltinReward,
    CustomReward,
    RewardCall,
    RewardLoadError,
    check_reward_function,
    make_reward,
)
from asyncrl.producers.reward_pool import make_pool
from asyncrl.schemas.sample import Sample, Trajectory
from tests.helpers import SMALL_MODEL

REWARD_FILE = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    print("scoring", solution_str)  # goes to the log, not into the protocol
    if solution_str == "boom":
        raise ZeroDivisionError("division by zero")
    if solution_str == "slow":
        time.sleep(30)
    if solution_str == "nan":
        return float("nan")
    if solution_str == "exit":
        import os
        os._exit(3)
    if solution_str == "kill":
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    if solution_str == "dict":
        return {"score": 0.5, "acc": True, "label": "text is not a metric", "pred": "42"}
    if solution_str == "turns":
        return sum(extra_info["turn_scores"])
    if solution_str == "info":
        return float(extra_info["index"] + extra_info["num_turns"])
    return float(solution_str.strip() == ground_truth) + bonus

def other(data_source, solution_str, ground_truth, extra_info=None):
    return 2.0
"""


@pytest.fixture
def reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_FILE)
    return path


def _cfg(*overrides: str):
    return load_config(overrides=list(overrides))


def _call(text: str, truth: str = "42", **extra) -> RewardCall:
    return RewardCall("my_math", truth, extra, [{"role": "assistant", "content": text}], text)


@pytest.fixture
def reward(reward_file: Path):
    r = make_reward(
        _cfg(
            f"custom_reward_function.path={reward_file}",
            "custom_reward_function.timeout_s=1",
        )
    )
    yield r
    r.close()


def test_scores_floats_and_dicts(reward: CustomReward) -> None:
    assert reward(_call("42")).score == 1.0 and not reward(_call("42")).failed
    assert reward(_call("41")).score == 0.0
    scored = reward(_call("dict"))
    # verl's math_dapo returns the extracted answer as "pred", a string: no metric either
    assert (scored.score, scored.extra, scored.error) == (0.5, {"acc": 1.0}, "")
    # extra_info: the row's, plus num_turns as verl adds it
    assert reward(RewardCall("d", "1", {"index": 7}, [], "info", num_turns=2)).score == 9.0
    # and the interaction's turn_scores, as verl's reward loop adds its agent loop's
    assert reward(RewardCall("d", "1", {}, [], "turns", turn_scores=[0.5, 1.0])).score == 1.5
    assert reward.failures == 0


def test_an_exception_is_a_counted_failure_not_a_zero(reward: CustomReward) -> None:
    scored = reward(_call("boom"))
    assert scored.failed and scored.error == "ZeroDivisionError: division by zero"
    assert reward(_call("nan")).failed  # not a number a reward can be
    assert reward.failures == 2
    assert reward(_call("42")).score == 1.0  # the next call is fine


def test_a_timeout_is_a_counted_failure_and_the_next_call_works(reward: CustomReward) -> None:
    t0 = time.monotonic()
    scored = reward(_call("slow"))
    assert time.monotonic() - t0 < 5
    assert scored.failed and "timed out after 1.0 s" in scored.error
    assert "custom_reward_function.timeout_s=1" in scored.error
    assert reward.failures == 1
    assert reward(_call("42")).score == 1.0  # a fresh process took over


def test_a_call_that_ends_the_process_is_said_so_not_called_a_timeout(
    reward: CustomReward,
) -> None:
    """A reward process that dies in a call (os._exit, a crash in native code, the OOM killer)
    was reported as "timed out after 0.0 s (custom_reward_function.timeout_s=1)"."""
    for text, how in (("exit", "exit status 3"), ("kill", "killed by SIGKILL")):
        scored = reward(_call(text))
        assert scored.failed and scored.error == f"the reward process died during the call ({how})"
    assert reward.failures == 2
    assert reward(_call("42")).score == 1.0  # a fresh process took over


def test_a_pool_scores_beside_its_caller_with_the_same_failures(reward_file: Path) -> None:
    """custom_reward_function.num_workers calls at once, each in a process of its own: the
    other calls come back while one runs into its timeout, which is the same reward failure
    as inline, and that process is replaced for the next call."""
    cfg = _cfg(
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.timeout_s=1",
        "custom_reward_function.num_workers=2",
    )
    pool = make_pool(cfg, make_reward(cfg))
    assert pool is not None and pool.size == 2
    assert make_pool(_cfg(), BuiltinReward(_cfg())) is None  # the built-in rules: inline
    try:
        t0 = time.monotonic()
        for key, text in (("slow", "slow"), ("a", "42"), ("b", "41"), ("c", "boom")):
            pool.submit(key, _call(text))
        assert time.monotonic() - t0 < 0.1  # submitting waits for nothing
        order, results = [], {}
        while len(results) < 4 and time.monotonic() - t0 < 10:
            for key, scored, _ in pool.results(timeout=0.1):
                order.append(key)
                results[key] = scored
        assert order[-1] == "slow" and pool.pending == 0
        assert results["slow"].failed and "timed out after 1.0 s" in results["slow"].error
        assert (results["a"].score, results["b"].score) == (1.0, 0.0)
        assert results["c"].failed and "ZeroDivisionError" in results["c"].error
        for key in ("d", "e"):  # both processes serve again
            pool.submit(key, _call("42"))
        got = []
        while len(got) < 2 and time.monotonic() - t0 < 15:
            got += [scored.score for _, scored, _ in pool.results(timeout=0.1)]
        assert got == [1.0, 1.0]
    finally:
        pool.close()


def test_a_module_beside_the_reward_file_imports(tmp_path: Path) -> None:
    """A reward file importing a helper next to it failed to load (ModuleNotFoundError)
    unless the run was started from that folder."""
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "my_utils.py").write_text("def half():\n    return 0.5\n")
    path = tmp_path / "rewards" / "my_reward.py"
    path.write_text(
        "from my_utils import half\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return half()\n"
    )
    reward = make_reward(_cfg(f"custom_reward_function.path={path}"))
    try:
        assert reward(_call("42")).score == 0.5
    finally:
        reward.close()


def test_a_function_that_cannot_take_the_calls_arguments_stops_the_run(
    reward_file: Path, tmp_path: Path
) -> None:
    """A reward_kwargs entry the function does not take (or a function without extra_info)
    failed every call: each trajectory a reward failure, and the run went on to its last step
    training on nothing, its console saying only "reward failures 48"."""
    cfg = _cfg(f"custom_reward_function.path={reward_file}", "custom_reward_function.name=other")
    assert check_reward_function(cfg) is None
    cfg = _cfg(
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=other",
        "custom_reward_function.reward_kwargs.bonus=1.0",
    )
    key, why = check_reward_function(cfg) or ("", "")
    assert key == "custom_reward_function.reward_kwargs"
    assert why.startswith("other(data_source, solution_str, ground_truth, extra_info=None) ")
    assert why.endswith("got an unexpected keyword argument 'bonus'")
    with pytest.raises(ConfigError, match="custom_reward_function.reward_kwargs: other"):
        check_startable(cfg, "rollout")
    narrow = tmp_path / "narrow.py"
    narrow.write_text("def compute_score(data_source, solution_str, ground_truth):\n    return 1\n")
    key, why = check_reward_function(_cfg(f"custom_reward_function.path={narrow}")) or ("", "")
    assert key == "custom_reward_function.name" and "'extra_info'" in why


def test_name_and_reward_kwargs(reward_file: Path) -> None:
    cfg = _cfg(
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.reward_kwargs.bonus=0.25",
    )
    r = make_reward(cfg)
    try:
        assert r(_call("42")).score == 1.25
    finally:
        r.close()
    cfg = _cfg(f"custom_reward_function.path={reward_file}", "custom_reward_function.name=other")
    r = make_reward(cfg)
    try:
        assert r(_call("anything")).score == 2.0
    finally:
        r.close()


def test_a_missing_file_or_function_stops_the_run_naming_the_key(
    reward_file: Path, tmp_path: Path
) -> None:
    missing = _cfg(f"custom_reward_function.path={tmp_path / 'nope.py'}")
    with pytest.raises(ConfigError, match=r"custom_reward_function.path: .*nope.py: no such file"):
        check_startable(missing, "run")
    with pytest.raises(RewardLoadError, match="custom_reward_function.path"):
        make_reward(missing)
    no_fn = _cfg(f"custom_reward_function.path={reward_file}", "custom_reward_function.name=score")
    with pytest.raises(ConfigError, match=r"custom_reward_function.name: .*no function 'score'"):
        check_startable(no_fn, "rollout")
    broken = tmp_path / "broken.py"
    broken.write_text("def compute_score(:\n")
    with pytest.raises(ConfigError, match=r"custom_reward_function.path: .*SyntaxError"):
        check_startable(_cfg(f"custom_reward_function.path={broken}"), "run")
    check_startable(_cfg(f"custom_reward_function.path={reward_file}"), "run")


def test_the_builtin_rule_scores_the_task_or_each_rows_data_source() -> None:
    arithmetic = BuiltinReward(_cfg())
    assert arithmetic(_call("42<eos>", "42")).score == 1.0
    assert arithmetic(_call("4", "42")).score == 0.0
    rows = BuiltinReward(_cfg("data.train_files=a.parquet", "data.val_files=b.parquet"))
    call = _call("[347*86]", "29842")
    call.data_source = "calculator"  # a tool call is no answer
    assert rows(call).score == 0.0


# --- the trainer's side -------------------------------------------------------------------------
def _traj(reward: float, error: str = "", extra: dict | None = None) -> Trajectory:
    return Trajectory(
        response_ids=[5, 6, 2],
        response_logprobs=[-1.0] * 3,
        reward=reward,
        reward_error=error,
        reward_extra=json.dumps(extra) if extra else "",
    )


def test_failed_trajectories_get_no_advantage_and_the_group_compares_the_rest() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    valid = torch.tensor([[True, False, True, True]])
    adv = group_advantages(rewards, True, valid=valid)
    std = (((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2) ** 0.5
    expected = [(2 / 3) / std, 0.0, -(1 / 3) / std, -(1 / 3) / std]
    assert adv[0].tolist() == pytest.approx(expected, rel=1e-5)  # eps=1e-6 in the std
    all_valid = torch.ones_like(valid)
    assert torch.allclose(
        group_advantages(rewards, True, valid=all_valid), group_advantages(rewards, True)
    )
    one_left = torch.tensor([[True, False, False, False]])
    assert group_advantages(rewards, True, valid=one_left).tolist() == [[0.0] * 4]


def test_the_update_leaves_failed_trajectories_out_and_counts_them() -> None:
    from asyncrl.models.tiny import build_model

    cfg = _cfg(
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "async_training.require_batches=2",
        *SMALL_MODEL,
    )
    ok = Sample("a@0", "a", 0, [1, 4], "1", [_traj(1.0, extra={"acc": 1.0}), _traj(0.0)])
    failed = Sample("b@0", "b", 0, [1, 5], "1", [_traj(0.0, "TimeoutError"), _traj(0.0, "x")])
    assert reward_valid([ok]) is None  # no failure: the update is the one it always was
    assert reward_valid([ok, failed]).tolist() == [[True, True], [False, False]]
    assert reward_metrics([ok, failed]) == {"reward/failures": 2.0, "reward/acc/mean": 1.0}

    model = build_model(cfg.actor_rollout_ref.model, 16, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = grpo_update(model, opt, [failed], cfg, torch.device("cpu"))
    assert metrics["reward/failures"] == 2.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), (
        "a mini-batch of failed trajectories must not move the weights"
    )
    metrics = grpo_update(model, opt, [ok, failed], cfg, torch.device("cpu"))
    assert metrics["reward/failures"] == 2.0 and "actor/pg_loss" in metrics
    assert metrics["critic/score/mean"] == 0.5  # failed ones are no score
