"""Start-up checks of the files a run reads and writes: its directory, the model cache, the
checkpoint and its positions, the data files, the reward function."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from asyncrl.config import ConfigError, RunConfig
from asyncrl.launch.preflight_check import Check

RUN_SUBDIRS = ("checkpoints", "logs", "log")
"""What a run writes under its directory; one already there may be elsewhere (a link, a mount)."""


def output_dir_check(cfg: RunConfig) -> Check:
    """The run's directory, and those of its subdirectories already there (``checkpoints`` may
    be a link to another disk, read-only), can be written."""
    problem = _unwritable_dir(cfg.run_dir)
    if problem:
        return Check("output_dir", False, f"{cfg.run_dir}: {problem}")
    for path in (cfg.run_dir / sub for sub in RUN_SUBDIRS):
        if path.is_dir():
            problem = _unwritable_dir(path)
        elif path.exists() or path.is_symlink():  # a file, a link to nowhere
            problem = "not a directory"
        if problem:
            return Check("output_dir", False, f"{path}: {problem}")
    return Check("output_dir", True, f"{cfg.run_dir} (writable)")


def cache_dir_check(cfg: RunConfig) -> Check:
    """The demo policy is cached there once warm-started (a minute of work lost otherwise)."""
    key = "actor_rollout_ref.model.cache_dir"
    if cfg.actor_rollout_ref.model.path is not None:
        return Check(key, True, "unused (model.path is set)")
    from asyncrl.models.cache import policy_dir

    where = policy_dir(cfg).parent
    problem = _unwritable_dir(where)
    if problem:
        return Check(key, False, f"{where}: {problem}")
    return Check(key, True, f"{where} (writable)")


def _unwritable_dir(path: Path) -> str | None:
    """Why a directory could not be made or written at ``path`` (None: it can). The nearest
    existing ancestor must be a directory in which one can create a directory: tried, then
    removed (``os.access`` says yes to root in /proc)."""
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".asyncrl-check-", dir=parent))
    except OSError as err:
        return f"cannot create a directory in {parent} ({err.strerror or err})"
    return None


def model_path_check(cfg: RunConfig) -> Check:
    from asyncrl.models.policy import PATH_KEY, check_model_path

    path = cfg.actor_rollout_ref.model.path
    if path is None:
        return Check(PATH_KEY, True, "unset: the built-in tiny model")
    problem = check_model_path(cfg)
    return Check(PATH_KEY, problem is None, problem or f"{path}: a Hugging Face checkpoint")


def model_length_checks(cfg: RunConfig) -> list[Check]:
    """A prompt and its response fit the checkpoint's positions (vLLM refuses a longer
    max_model_len too): a model with learned positions (GPT-2's) has none for a longer
    sequence."""
    from asyncrl.models.policy import check_model_path, max_positions

    path = cfg.actor_rollout_ref.model.path
    if path is None or check_model_path(cfg) is not None:
        return []
    declared = max_positions(path, cfg.actor_rollout_ref.model.override_config)
    if declared is None:
        return []
    name, limit = declared
    data = cfg.data
    longest = data.max_prompt_length + data.max_response_length
    key = "data.max_response_length"
    if longest <= limit:
        return [Check(key, True, f"prompt and response, {longest} tokens, within {name}={limit}")]
    return [
        Check(
            key,
            False,
            f"data.max_prompt_length + data.max_response_length = {data.max_prompt_length} + "
            f"{data.max_response_length} = {longest} tokens, more than the model takes "
            f"({name}={limit} in {path}/config.json or actor_rollout_ref.model.override_config)"
            ": shorten them",
        )
    ]


def data_files_checks(cfg: RunConfig, rows: bool = False) -> list[Check]:
    """Each file there, parquet, with the prompt (data.prompt_key) and reward columns: what the
    launcher's read of the rows would stop on, found from the files' footers before it starts.
    ``rows`` (the dry run): every row too, malformed values, no rows, a data_source no reward
    scores, and each prompt through the policy's tokenizer (chat messages with no chat
    template, every prompt over data.max_prompt_length): a real run finds those in its set-up
    (``tasks.files.load_split``), which reads the rows anyway: not read twice there."""
    if not cfg.data.from_files:
        return []
    from asyncrl.models.policy import check_model_path, load_tokenizer
    from asyncrl.producers.agent.data import checked_rows, load_split
    from asyncrl.tasks.files import check_file

    tokenizer = None
    if rows and check_model_path(cfg) is None:  # a bad model.path fails its own check
        tokenizer = load_tokenizer(cfg)
    checks = []
    for split, paths in (("train", cfg.data.train_paths), ("val", cfg.data.val_paths)):
        key = f"data.{split}_files"
        problems = [p for p in (check_file(path, cfg.data.prompt_key) for path in paths) if p]
        if problems:
            checks.append(Check(key, False, "; ".join(problems)))
            continue
        detail = ", ".join(paths)
        if rows:
            try:
                read = checked_rows(cfg, split)
                detail += f" ({len(read)} rows"
                if tokenizer is not None:
                    too_long = load_split(cfg, split, tokenizer, read).too_long
                    detail += (
                        f", {too_long} longer than data.max_prompt_length="
                        f"{cfg.data.max_prompt_length} tokens after the chat template: left out"
                        if too_long
                        else ""
                    )
                detail += ")"
            except ConfigError as err:
                checks.append(Check(key, False, str(err).removeprefix(f"{key}: ")))
                continue
        checks.append(Check(key, True, detail))
    return checks


def reward_function_check(cfg: RunConfig, here: bool) -> Check:
    crf = cfg.custom_reward_function
    if crf.path is None:
        return Check("custom_reward_function.path", True, "unset: the task's built-in rule")
    if not here:
        return Check("custom_reward_function.path", None, "checked by each rollout worker")
    from asyncrl.producers.reward import check_reward_function

    problem = check_reward_function(cfg)
    if problem is not None:
        return Check(problem[0], False, problem[1])
    return Check("custom_reward_function.path", True, f"{crf.path}: {crf.name} loads")
