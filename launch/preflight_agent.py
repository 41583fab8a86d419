"""Start-up checks of the multi-turn agent: its tool and interaction configs, and a tokenizer
that can write and end a tool call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.launch.preflight_check import Check


def tool_checks(cfg: RunConfig) -> list[Check]:
    """The tool config loads; with multi-turn on, the policy's tokenizer can also end a tool
    call in ``multi_turn.format`` (the compact format stops at a ``]`` token, which the
    arithmetic task's tokenizer lacks: the roles would fail at start-up, again at each
    restart). A model that does not load is reported by its own check."""
    key = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable and mt.tool_config_path is None:
        return [Check(key, True, "unused (multi_turn.enable=false)")]
    from asyncrl.producers.tools.registry import ToolConfigError, load_tools, shipped_tools_path

    path = Path(mt.tool_config_path).expanduser() if mt.tool_config_path else shipped_tools_path()
    try:
        tools = load_tools(path)
    except ToolConfigError as err:
        return [Check(key, False, str(err))]  # it names the file
    checks = [Check(key, True, f"{path}: tools {', '.join(sorted(tools))}")]
    if mt.enable:
        checks += _tool_call_format(cfg, tools)
    return checks


def interaction_checks(cfg: RunConfig) -> list[Check]:
    """The interaction config loads (each class imports and is built, as every worker and the
    trainer's evaluation build it), and the built-in tasks' prompts, which carry no
    interaction_kwargs, can pick one: only where there is one. A data file's rows are checked
    with the rows (``tasks.files.checked_rows``)."""
    from asyncrl.producers.agent.interaction import KEY, load_interactions
    from asyncrl.producers.tools.registry import ConfigFileError

    path = cfg.actor_rollout_ref.rollout.multi_turn.interaction_config_path
    if path is None:
        return []
    try:
        names = list(load_interactions(path))
    except ConfigFileError as err:
        return [Check(KEY, False, str(err))]  # it names the file and the entry
    if not cfg.data.from_files and len(names) > 1:
        return [
            Check(
                KEY,
                False,
                f"{path}: interactions {', '.join(names)}, and data.task={cfg.data.task}'s "
                "prompts name none (extra_info.interaction_kwargs.name): keep one, or train "
                "on data files whose rows name theirs",
            )
        ]
    return [Check(KEY, True, f"{path}: interactions {', '.join(names)}")]


HERMES_CALL = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
"""A hermes call: its markup and JSON must survive the tokenizer for a model to write one."""


def _spells(tokenizer: Any, text: str) -> None:
    """ValueError if ``text`` has characters the tokenizer turns into its unknown token (the
    built-in model's, which knows digits and operators): the model cannot write it."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    unk = tokenizer.unk_token_id
    if unk is not None and unk in ids:
        raise ValueError(
            f"the tokenizer cannot write a tool call {text!r} (it reads back as "
            f"{tokenizer.decode(ids)[:40]!r}...); the built-in model writes format=compact"
        )


def _tool_call_format(cfg: RunConfig, tools: dict[str, Any]) -> list[Check]:
    from asyncrl.models.policy import load_tokenizer
    from asyncrl.producers.agent.loop import stop_token_ids
    from asyncrl.producers.agent.parser import make_parser

    key = "actor_rollout_ref.rollout.multi_turn.format"
    fmt = cfg.actor_rollout_ref.rollout.multi_turn.format
    try:
        tokenizer = load_tokenizer(cfg)
    except Exception:  # a bad model: its own check says so
        return []
    try:
        stop_token_ids(tokenizer, make_parser(fmt, tools))
        if fmt == "hermes":
            _spells(tokenizer, HERMES_CALL)
    except ValueError as err:
        if cfg.actor_rollout_ref.model.path:
            whose = f"{cfg.actor_rollout_ref.model.path}'s tokenizer"
        elif fmt == "hermes":  # no built-in tokenizer spells JSON
            whose = f"data.task={cfg.data.task}'s tokenizer"
        else:  # the built-in tokenizers are the tasks' characters
            whose = f"data.task={cfg.data.task}'s tokenizer; data.task=calculator has the tokens"
        return [Check(key, False, f"{fmt}: {err} ({whose})")]
    return [Check(key, True, f"{fmt}: the tokenizer ends a tool call")]
