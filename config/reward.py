"""The ``custom_reward_function`` section: your reward function."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from asyncrl.config.base import MAX_WAIT_S, Strict


class CustomRewardFunctionConfig(Strict):
    """verl's ``custom_reward_function``: your reward, scored by the rollout workers."""

    path: str | None = None
    """A Python file defining the reward function (its folder is on the import path: modules
    beside it import); None: the built-in rule of the task (of data.task, or of each prompt's
    data_source with data.train_files)."""
    name: str = "compute_score"
    """The function in that file: ``name(data_source, solution_str, ground_truth,
    extra_info=None, **reward_kwargs)`` returning a float, or a dict with "score" and other
    numbers (logged as reward/<key>/mean)."""
    timeout_s: float = Field(10.0, gt=0, le=MAX_WAIT_S)
    """Longest one call may take. A call that raises or times out is a reward failure: logged,
    counted (reward/failures) and its trajectory marked (reward_error), never trained on."""
    reward_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments passed to every call (verl's reward_kwargs)."""
    num_workers: int = Field(4, ge=1, le=64)
    """Calls scored at once per rollout worker, each in a process of its own, off the worker's
    decoding loop: the engine decodes while rewards are computed (verl's
    reward_model.num_workers). A sample is published once all its trajectories are scored."""
