"""A run's saved config holds absolute paths, taken once from the directory its config was
first loaded in: ``asyncrl prepare`` run in a project with ``data.train_files=data/t.parquet``
and ``custom_reward_function.path=my_reward.py``, then ``asyncrl train --config
proj/runs/r/config.yaml`` started from another directory said "cannot start: ... no such file"
for each (it read them from its own directory), and a role that did start wrote its run
elsewhere (a relative output_dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import dump_config, load_config
from asyncrl.launch.preflight import check_startable


def test_a_saved_config_means_the_same_files_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    (project / "data").mkdir(parents=True)
    (project / "tools.yaml").write_text("tools: []\n")
    (project / "my_reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 0.0\n"
    )
    elsewhere.mkdir()
    monkeypatch.chdir(project)
    cfg = load_config(
        overrides=[
            "run_id=r",
            "data.train_files=[data/a.parquet, ./data/b.parquet]",
            "data.val_files=data/v.parquet",
            "custom_reward_function.path=my_reward.py",
            "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",  # a Hub id: kept
        ]
    )
    dump_config(cfg, cfg.run_dir / "config.yaml")

    monkeypatch.chdir(elsewhere)
    saved = load_config(project / "runs" / "r" / "config.yaml")
    assert saved.output_dir == str(project / "runs")
    assert saved.run_dir == project / "runs" / "r"
    assert saved.data.train_files == [
        str(project / "data/a.parquet"),
        str(project / "data/b.parquet"),
    ]
    assert saved.data.val_files == str(project / "data/v.parquet")
    assert saved.custom_reward_function.path == str(project / "my_reward.py")
    assert saved.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    # the rollout role's start-up check of the reward file passes from here
    saved.actor_rollout_ref.model.path = None
    check_startable(saved, "rollout")


def test_a_relative_model_directory_tool_and_interaction_config_become_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.model.path=models/m",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml",
            "actor_rollout_ref.rollout.multi_turn.interaction_config_path=users.yaml",
            "output_dir=~/runs",
        ]
    )
    assert cfg.actor_rollout_ref.model.path == str(tmp_path / "models" / "m")
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    assert multi_turn.tool_config_path == str(tmp_path / "tools.yaml")
    assert multi_turn.interaction_config_path == str(tmp_path / "users.yaml")
    assert cfg.output_dir == str(Path.home() / "runs")
