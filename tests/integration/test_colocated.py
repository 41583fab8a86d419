"""The colocated sync baseline runs any shipped task through the same agent loop as the rollout
workers: on the calculator task its rollouts call the tool, and its updates see only the
model's tokens (the baseline `asyncrl bench learn --config calculator` compares against)."""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.consumers.colocated import main as colocated
from asyncrl.consumers.colocated import rollout
from tests.integration.test_agent_rollout import SETTINGS

pytestmark = pytest.mark.slow


@pytest.fixture
def calculator_cfg(policy_dir, tmp_path):
    return load_config(
        "calculator",
        [
            f"actor_rollout_ref.model.cache_dir='{policy_dir}'",
            f"output_dir='{tmp_path}'",
            *SETTINGS,
            "trainer.total_training_steps=3",
            "trainer.test_freq=3",
        ],
    )


def test_colocated_rollouts_call_the_calculator_with_tool_tokens_masked(calculator_cfg):
    from asyncrl.models.warm_start import load_policy
    from asyncrl.producers.agent.factory import make_runner
    from asyncrl.producers.engines.hf import HFEngine
    from asyncrl.producers.feed import train_prompts
    from asyncrl.producers.reward import make_reward
    from asyncrl.producers.scoring import TrajectoryScorer

    model, tok = load_policy(calculator_cfg)
    model.eval()
    engine = HFEngine(model, tok, 1.0, tok.eos_token_id, tok.pad_token_id, seed=0)
    runner = make_runner(calculator_cfg, tok, engine)
    scorer = TrajectoryScorer(make_reward(calculator_cfg), tok, 0)
    train, _ = train_prompts(calculator_cfg)
    try:
        samples = rollout(runner, scorer, train[:4], 4, calculator_cfg)
    finally:
        runner.close()
        scorer.close()

    assert [len(s.trajectories) for s in samples] == [4] * 4
    trajs = [t for s in samples for t in s.trajectories]
    called = [t for t in trajs if t.tool_calls]
    assert called, "the warm start calls the tool in about half its samples"
    for t in called:
        assert t.num_turns >= 2 and 0 in t.response_mask
        assert len(t.response_mask) == len(t.response_ids) == len(t.response_logprobs)
        # Tool tokens: mask 0 and logprob 0; the model's tokens: mask 1 and a real logprob.
        pairs = list(zip(t.response_logprobs, t.response_mask, strict=True))
        assert all(lp == 0.0 for lp, m in pairs if not m)
        assert any(lp < 0.0 for lp, m in pairs if m)
    # Rewards are the task's: a correct product scores 1, anything else 0.
    assert {t.reward for t in trajs} <= {0.0, 1.0}


def test_colocated_trains_on_the_calculator_task_and_reports_tool_use(calculator_cfg):
    history = colocated(calculator_cfg, log=lambda _: None)

    assert [h["step"] for h in history] == [0, 1, 2, 3]
    assert "val_tool_use" in history[0] and "val_tool_use" in history[-1]
    assert 0.0 <= history[-1]["val_acc"] <= 1.0
    assert sum(h["agent/tool_calls/mean"] for h in history[1:]) > 0
    assert all(h["num_turns/mean"] >= 2 for h in history[1:])  # verl's: the prompt counts
    assert history[-1]["time_s"] > history[1]["time_s"] > 0


TIMINGS = {"time_s", "gen_samples_per_s", "train_samples_per_s", "agent/tool_latency_s/mean"}


def test_the_colocated_baseline_repeats_exactly_with_the_same_seed(calculator_cfg):
    """Its rollouts and held-out evaluations wait for each step's tool calls, so when a call
    comes back cannot change which draws a trajectory gets (AgentRunner.wait_for_tools)."""
    runs = [
        [
            {k: v for k, v in h.items() if k not in TIMINGS}
            for h in colocated(calculator_cfg, log=lambda _: None)
        ]
        for _ in range(2)
    ]
    assert sum(h["agent/tool_calls/mean"] for h in runs[0][1:]) > 0
    assert runs[0] == runs[1]


@pytest.mark.parametrize("name", ["hf", "hf_cached", "hf_static"])
def test_the_baseline_generates_with_the_engine_the_config_names(calculator_cfg, name, monkeypatch):
    """As the rollout workers do (rollout.name, hf_cached by default): a baseline on another
    engine would not be the same workload."""
    from asyncrl.producers.engines import factory

    made = []
    make = factory.make_engine
    monkeypatch.setattr(
        factory, "make_engine", lambda *a, **k: made.append(make(*a, **k)) or made[-1]
    )
    cfg = calculator_cfg.model_copy(deep=True)
    cfg.actor_rollout_ref.rollout.name = name
    cfg.trainer.total_training_steps = 1
    colocated(cfg, log=lambda _: None)
    classes = {"hf": "HFEngine", "hf_cached": "CachedHFEngine", "hf_static": "StaticHFEngine"}
    assert [type(e).__name__ for e in made] == [classes[name]]


def test_the_countdown_task_warm_starts_and_trains_with_its_long_responses(
    countdown_policy, tmp_path
):
    """The long-tail task end to end in one process: its tokenizer (with ``,``), its model's
    128 positions, its sloppy teacher, and chains of up to 102 tokens generated and scored."""
    from asyncrl.models.warm_start import load_policy
    from asyncrl.tasks.countdown import POSITIONS

    cfg = load_config(
        "countdown",
        [
            *countdown_policy,
            f"output_dir='{tmp_path}'",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
        ],
    )
    model, _tok = load_policy(cfg)
    assert model.config.max_position_embeddings == POSITIONS
    history = colocated(cfg, log=lambda _: None)

    assert [h["step"] for h in history] == [0, 1, 2]
    # 60 warm-start steps already write chains of numbers, some of them long ones
    assert max(h["response_length/max"] for h in history[1:]) > 30
    assert 0.0 <= history[-1]["val_acc"] <= 1.0


@pytest.fixture
def demo_run(quick_policy, tmp_path, monkeypatch):
    """Runs the demo's baseline for 3 steps with ``overrides``; returns its history and the
    samples each step trained on (what ``grpo_update`` was given)."""
    from asyncrl.consumers import colocated as module

    trained: list[list] = []
    update = module.grpo_update
    monkeypatch.setattr(
        module,
        "grpo_update",
        lambda model, opt, samples, *a, **k: (
            trained.append(samples) or update(model, opt, samples, *a, **k)
        ),
    )

    def run(*overrides: str) -> tuple[list[dict], list[list]]:
        cfg = load_config(
            None,
            [
                *quick_policy,
                f"output_dir='{tmp_path}'",
                "trainer.total_training_steps=3",
                "trainer.test_freq=0",
                *overrides,
            ],
        )
        return colocated(cfg, log=lambda _: None), trained

    return run


def test_a_baseline_step_trains_on_the_trainers_step_of_samples(demo_run):
    """require_batches x ppo_mini_batch_size prompts a step, as the async trainer's step (it
    took one mini-batch whatever require_batches said)."""
    _, trained = demo_run("async_training.require_batches=2")
    assert [len(samples) for samples in trained] == [16, 16, 16]
    assert len({s.prompt_id for samples in trained for s in samples}) == 48


def test_dynamic_sampling_trains_only_groups_with_signal_and_fills_the_step(demo_run):
    """DAPO's loop in the baseline: a group whose answers all score the same is left out and
    further prompts are generated (the baseline ignored algorithm.filter_groups)."""
    history, trained = demo_run("algorithm.filter_groups.enable=true")
    assert [len(samples) for samples in trained] == [8, 8, 8]
    for samples in trained:
        assert all(len(set(s.rewards)) > 1 for s in samples)
    filtered = [h["filter_groups/filtered_groups"] for h in history[1:]]
    assert sum(filtered) > 0, "the demo's warm start leaves many groups all right or all wrong"
    assert history[-1]["fully_async/count/filtered_samples"] == sum(filtered)
    assert all(
        h["train/num_gen_batches"] >= 2 for h, f in zip(history[1:], filtered, strict=True) if f
    )


def test_dynamic_sampling_fails_as_dapo_after_max_num_gen_batches(demo_run):
    with pytest.raises(RuntimeError, match="max_num_gen_batches=1"):
        demo_run(
            "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=1"
        )


SPLIT_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.25 if extra_info["split"] == "train" else 0.75
"""


def test_the_baseline_reads_the_data_files_and_reward_the_async_run_reads(demo_run, tmp_path):
    """``asyncrl bench learn`` with a user's own data: the baseline ran data.task's built-in
    problems only and stopped with a traceback on data.train_files, so async could not be
    compared with colocated on that data. It now trains on the files' rows, scored by
    custom_reward_function, and measures held-out accuracy on data.val_files."""
    from asyncrl.tasks.files import export_task

    data = export_task(load_config(None, ["data.val_size=16"]).data, tmp_path / "data")
    reward = tmp_path / "split_reward.py"
    reward.write_text(SPLIT_REWARD)
    history, trained = demo_run(
        f"data.train_files={data['train']}",
        f"data.val_files={data['val']}",
        f"custom_reward_function.path={reward}",
        "custom_reward_function.num_workers=1",
    )
    samples = [s for step in trained for s in step]
    assert len(samples) == 24 and all(s.prompt_id.startswith("train-") for s in samples)
    assert {t.reward for s in samples for t in s.trajectories} == {0.25}
    assert history[0]["val_acc"] == history[-1]["val_acc"] == 0.75
