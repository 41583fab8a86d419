"""The agent runner a run's config asks for: the multi-turn loop with its tools, or (multi_turn
off) the single-turn rollout as a one-turn agent, so both go through the same code. Also the
held-out evaluation the trainer reports (``val/accuracy``)."""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.producers.agent.eval_engine import eval_engine, evaluation_engine
from asyncrl.producers.agent.interaction import ConfiguredInteractions, load_interactions
from asyncrl.producers.agent.loop import AgentLimits, AgentLoop
from asyncrl.producers.agent.parser import SingleTurn, ToolParser, make_parser
from asyncrl.producers.agent.runner import AgentRunner
from asyncrl.producers.engines.base import Engine
from asyncrl.producers.tools.registry import ToolExecutor, run_tools
from asyncrl.tasks.arithmetic import Problem, score

log = logging.getLogger(__name__)


def make_runner(
    cfg: RunConfig,
    tokenizer: Any,
    engine: Engine,
    greedy: bool = False,
    wait_for_tools: bool = False,
) -> AgentRunner:
    """The run's agent runner. ``wait_for_tools`` trades the overlap of tool calls with
    decoding for runs that repeat exactly (see :class:`AgentRunner`): on for the held-out
    evaluation and the colocated baseline, off for rollout workers."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    parser: ToolParser
    if mt.enable:
        tools = run_tools(cfg)
        parser = make_parser(mt.format, tools)
        limits = AgentLimits(
            max_assistant_turns=mt.max_assistant_turns,
            max_user_turns=mt.max_user_turns,
            response_length=cfg.data.max_response_length,
            max_tool_response_length=mt.max_tool_response_length,
        )
    else:
        tools, parser = {}, SingleTurn()
        limits = AgentLimits(1, 0, cfg.data.max_response_length, 1)
    loop = AgentLoop(
        tokenizer,
        parser,
        limits,
        interaction=run_interaction(cfg),
        greedy=greedy,
        chat_kwargs=cfg.data.apply_chat_template_kwargs,
    )
    return AgentRunner(loop, engine, ToolExecutor(tools), wait_for_tools=wait_for_tools)


def run_interaction(cfg: RunConfig) -> ConfiguredInteractions | None:
    """The run's interactions (``multi_turn.interaction_config_path``), or None; with the
    agent loop off, none: a single turn has no user."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable or mt.interaction_config_path is None:
        return None
    return ConfiguredInteractions(load_interactions(mt.interaction_config_path))


def _eval_runner(
    cfg: RunConfig, model: Any, tokenizer: Any, running: Engine | None, idle: bool = False
) -> tuple[AgentRunner, Engine]:
    """The agent runner of a held-out evaluation and its engine (close both after): the
    policy on the rollout's kind of engine (:func:`evaluation_engine`), greedy or sampled with
    a fixed seed (``rollout.val_kwargs.do_sample``), waiting for each step's tool calls so
    that the same weights always score the same (``AgentRunner.wait_for_tools``)."""
    val = cfg.actor_rollout_ref.rollout.val_kwargs
    greedy = not val.do_sample or val.temperature == 0
    engine = evaluation_engine(cfg, model, tokenizer, running, greedy=greedy, idle=idle)
    runner = make_runner(cfg, tokenizer, engine, greedy=greedy, wait_for_tools=True)
    return runner, engine


def evaluate_agent(
    cfg: RunConfig,
    model: Any,
    tokenizer: Any,
    problems: list,
    batch_size: int = 64,
    running: Engine | None = None,
    idle: bool = False,
) -> dict[str, float]:
    """Accuracy and tool-use rate of the multi-turn policy on ``problems``: greedy, or
    sampled with a fixed seed (``rollout.val_kwargs.do_sample``); ``running``, ``idle``: a
    rollout engine holding ``model``'s weights (see :func:`held_out_accuracy`)."""
    from asyncrl.tasks import calculator, score

    runner, engine = _eval_runner(cfg, model, tokenizer, running, idle)
    correct = used = 0.0
    try:
        for start in range(0, len(problems), batch_size):
            chunk = {str(start + i): p for i, p in enumerate(problems[start : start + batch_size])}
            for rid, p in chunk.items():
                ids = tokenizer(p.prompt)["input_ids"]
                runner.add(rid, runner.start_state(ids, p.prompt))
            while runner.busy:
                for rid, state in runner.step():
                    correct += score(cfg.data.task, chunk[rid].answer, state.messages)
                    used += calculator.used_tool(state.messages)
    finally:
        runner.close()
        engine.close()
    n = max(len(problems), 1)
    return {"accuracy": correct / n, "tool_use": used / n}


def held_out_set(cfg: RunConfig, tokenizer: Any) -> list:
    """The held-out prompts: data.task's val problems, or the rows of data.val_files whose
    prompt fits data.max_prompt_length tokens after the chat template."""
    if not cfg.data.from_files:
        from asyncrl.tasks import splits

        return splits(cfg.data)[1]
    from asyncrl.producers.agent.data import load_split

    split = load_split(cfg, "val", tokenizer)
    log.info(
        "held-out set: %d of the %d prompts in data.val_files (%d longer than "
        "data.max_prompt_length=%d tokens after the chat template: left out)",
        len(split.rows),
        split.total,
        split.too_long,
        cfg.data.max_prompt_length,
    )
    return split.rows


@functools.cache
def _eval_reward(cfg_json: str) -> Any:
    """One reward per config for the evaluations (a custom one keeps its process)."""
    from asyncrl.producers.reward import make_reward

    return make_reward(RunConfig.model_validate_json(cfg_json))


def evaluate_rows(
    cfg: RunConfig,
    model: Any,
    tokenizer: Any,
    rows: list,
    batch_size: int = 64,
    running: Engine | None = None,
    idle: bool = False,
) -> dict[str, float]:
    """Held-out figures on dataset rows (``asyncrl.tasks.files.DataRow``): ``accuracy`` is the
    mean reward (the task's rule or custom_reward_function; a reward failure counts 0 and is
    logged), greedy or sampled as :func:`evaluate_agent`, and
    ``val-core/<data_source>/reward/mean@1`` that of each data source's rows (verl's name);
    ``tool_use`` with the agent loop."""
    from asyncrl.producers.reward import RewardCall
    from asyncrl.tasks import calculator

    runner, engine = _eval_runner(cfg, model, tokenizer, running, idle)
    reward = _eval_reward(cfg.model_dump_json())
    total = used = 0.0
    failures: list[str] = []
    by_source: dict[str, list[float]] = {}
    try:
        for start in range(0, len(rows), batch_size):
            chunk = {str(start + i): r for i, r in enumerate(rows[start : start + batch_size])}
            for rid, row in chunk.items():
                ids = runner.prompt_ids(row.prompt, cfg.data.max_prompt_length)
                runner.add(rid, runner.start_state(ids, row.prompt, row.extra_info))
            while runner.busy:
                for rid, state in runner.step():
                    row = chunk[rid]
                    scored = reward(
                        RewardCall(
                            data_source=row.data_source,
                            ground_truth=row.ground_truth,
                            extra_info=dict(row.extra_info),
                            messages=state.messages,
                            solution_str=tokenizer.decode(
                                state.response_ids, skip_special_tokens=True
                            ),
                            num_turns=1 + max(state.num_turns, 1),
                            turn_scores=list(state.turn_scores),
                        )
                    )
                    if scored.failed:
                        failures.append(f"{row.prompt_id}: {scored.error}")
                    total += scored.score
                    by_source.setdefault(row.data_source, []).append(scored.score)
                    used += calculator.used_tool(state.messages)
    finally:
        runner.close()
        engine.close()
    if failures:
        log.warning(
            "held-out evaluation: %d reward failures (counted as 0), e.g. %s",
            len(failures),
            json.dumps(failures[:3]),
        )
    n = max(len(rows), 1)
    out = {"accuracy": total / n}
    for source, scores in sorted(by_source.items()):  # verl's names, one answer per prompt
        out[f"val-core/{source}/reward/mean@1"] = sum(scores) / len(scores)
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        out["tool_use"] = used / n
    return out


def held_out_accuracy(
    cfg: RunConfig,
    model: Any,
    tokenizer: Any,
    problems: list,
    running: Engine | None = None,
    idle: bool = False,
) -> dict[str, float]:
    """What the trainer, the colocated baseline and worker 0 report at each evaluation:
    ``accuracy`` (greedy, or sampled with ``rollout.val_kwargs.do_sample``) and, with the agent
    loop on, ``tool_use``, generated on the rollout's kind of engine (:func:`evaluation_engine`;
    ``running``: a rollout engine holding ``model``'s weights, shared where it can be;
    ``idle``: it has nothing else in flight and is lent whole). Single-turn greedy takes the
    batched fast path. With data.val_files, ``problems`` are its rows and accuracy is their
    mean reward (:func:`evaluate_rows`)."""
    import torch

    rollout = cfg.actor_rollout_ref.rollout
    if cfg.data.from_files:
        with torch.no_grad():
            return evaluate_rows(cfg, model, tokenizer, problems, running=running, idle=idle)
    with torch.no_grad():
        if rollout.multi_turn.enable or rollout.val_kwargs.do_sample:
            measured = evaluate_agent(cfg, model, tokenizer, problems, running=running, idle=idle)
            if not rollout.multi_turn.enable:
                del measured["tool_use"]
            return measured
        engine: str | Engine = rollout.name
        if rollout.name == "vllm":
            engine = evaluation_engine(cfg, model, tokenizer, running, idle=idle)
        try:
            acc = greedy_accuracy(
                model,
                tokenizer,
                problems,
                max_new_tokens=cfg.data.max_response_length,
                engine=engine,
            )
        finally:
            if not isinstance(engine, str):
                engine.close()
    return {"accuracy": acc}


def greedy_accuracy(
    model: Any,
    tokenizer: Any,
    problems: list[Problem],
    max_new_tokens: int = 8,
    batch_size: int = 256,
    engine: str | Engine = "hf_cached",
) -> float:
    """Share of ``problems`` whose greedy completion scores 1.0 (the demo's held-out metric),
    generated on ``engine``: an engine, or a rollout.name other than vllm (a fresh
    transformers engine: :func:`eval_engine`)."""
    import torch

    from asyncrl.producers.engines.base import GenRequest

    gen = (
        eval_engine(engine)(model, tokenizer, 1.0, tokenizer.eos_token_id, tokenizer.pad_token_id)
        if isinstance(engine, str)
        else engine
    )
    correct = 0.0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        # one call for the chunk: a call per prompt took 4 ms of a 39 ms evaluation
        prompt_ids = tokenizer([p.prompt for p in chunk])["input_ids"]
        reqs = [
            GenRequest(str(i), ids, max_new_tokens, greedy=True) for i, ids in enumerate(prompt_ids)
        ]
        with torch.no_grad():
            results = gen.generate(reqs)
        for p, res in zip(chunk, results, strict=True):
            correct += score(p.answer, tokenizer.decode(res.response_ids, skip_special_tokens=True))
    return correct / max(len(problems), 1)
