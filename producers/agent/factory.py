"""The agent runner a run's config asks for: the multi-turn loop with its tools, or (multi_turn
off) the single-turn rollout as a one-turn agent, so both go through the same code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.ops.config import RunConfig
from asyncrl.producers.agent.loop import AgentLimits, AgentLoop, AgentRunner
from asyncrl.producers.agent.parser import SingleTurn, ToolParser, make_parser
from asyncrl.producers.agent.state import AgentState
from asyncrl.producers.engines.base import Engine
from asyncrl.producers.tools.registry import ToolExecutor, load_tools


def shipped_tools_path() -> Path:
    """The calculator's tool config, shipped with the package."""
    import asyncrl

    return Path(asyncrl.__file__).parent / "configs" / "tools" / "calculator.yaml"


def make_runner(
    cfg: RunConfig, tokenizer: Any, engine: Engine, greedy: bool = False
) -> AgentRunner:
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    parser: ToolParser
    if mt.enable:
        tools = load_tools(mt.tool_config_path or shipped_tools_path())
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
    loop = AgentLoop(tokenizer, parser, limits, greedy=greedy)
    return AgentRunner(loop, engine, ToolExecutor(tools))


def evaluate_agent(
    cfg: RunConfig, model: Any, tokenizer: Any, problems: list, batch_size: int = 64
) -> dict[str, float]:
    """Accuracy and tool-use rate of the multi-turn policy on ``problems``: greedy, or
    sampled with a fixed seed (``rollout.val_kwargs.do_sample``)."""
    from asyncrl.producers.engines.hf import HFEngine
    from asyncrl.tasks import calculator, score

    rollout = cfg.actor_rollout_ref.rollout
    engine = HFEngine(
        model,
        tokenizer,
        rollout.temperature,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        seed=cfg.trainer.seed,
    )
    runner = make_runner(cfg, tokenizer, engine, greedy=not rollout.val_kwargs.do_sample)
    correct = used = 0.0
    try:
        for start in range(0, len(problems), batch_size):
            chunk = {str(start + i): p for i, p in enumerate(problems[start : start + batch_size])}
            for rid, p in chunk.items():
                runner.add(rid, AgentState(tokenizer(p.prompt)["input_ids"]))
            while runner.busy:
                for rid, state in runner.step():
                    correct += score(cfg.data.task, chunk[rid].answer, state.messages)
                    used += calculator.used_tool(state.messages)
    finally:
        runner.close()
    n = max(len(problems), 1)
    return {"accuracy": correct / n, "tool_use": used / n}


def held_out_accuracy(
    cfg: RunConfig, model: Any, tokenizer: Any, problems: list
) -> dict[str, float]:
    """What the trainer and the colocated baseline report at each evaluation: ``accuracy``
    (greedy, or sampled with ``rollout.val_kwargs.do_sample``) and, with the agent loop on,
    ``tool_use``. Single-turn greedy takes the batched fast path."""
    import torch

    from asyncrl.models.tiny import greedy_accuracy

    rollout = cfg.actor_rollout_ref.rollout
    with torch.no_grad():
        if rollout.multi_turn.enable or rollout.val_kwargs.do_sample:
            measured = evaluate_agent(cfg, model, tokenizer, problems)
            if not rollout.multi_turn.enable:
                del measured["tool_use"]
            return measured
        acc = greedy_accuracy(
            model, tokenizer, problems, max_new_tokens=cfg.data.max_response_length
        )
    return {"accuracy": acc}
