"""verl's values of keys asyncrl has too, translated where verl means something else by them
(``-1``: never; ``null``: the default)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.config.verl_rules import Get, Refused


class Converted:
    """A verl value of one of asyncrl's keys, translated; ``note`` says how."""

    def __init__(self, value: Any, note: str) -> None:
        self.value, self.note = value, note


DROP = object()
"""Converted.value meaning: leave the key unset (asyncrl's default applies)."""


def _never_is_zero() -> Callable[[Any, Get], Any]:
    def convert(value: Any, _get: Get) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            return Converted(0, f"verl's {value} (never) is asyncrl's 0 (only at the end)")
        return value

    return convert


def _engine(value: Any, _get: Get) -> Any:
    if value in ("sglang", "trtllm"):
        raise Refused(
            f"{value} engine: asyncrl has no SGLang/TensorRT-LLM engine yet; its engines are "
            "vllm, hf_cached (transformers with a KV cache), hf_static (the same from fixed "
            "cache slots, CUDA graphs on a GPU), hf (no cache) and sim (a latency model)"
        )
    return value


def _estimator(value: Any, _get: Get) -> Any:
    if isinstance(value, str) and value != "grpo":
        why = (
            "PPO with a critic (verl's default estimator), and asyncrl trains no critic"
            if value == "gae"
            else "an estimator asyncrl does not compute"
        )
        raise Refused(
            f"{value} is {why}; asyncrl's only estimator is grpo (each answer's reward "
            "against its group's mean, divided by the group's std unless "
            "algorithm.norm_adv_by_std_in_grpo=false)"
        )
    return value


DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16"}
"""verl's short dtype names (it passes them to its PrecisionType), by torch's name."""


def _dtype(value: Any, _get: Get) -> Any:
    if isinstance(value, str) and value in DTYPES:
        return Converted(DTYPES[value], f"verl's {value} is {DTYPES[value]}")
    return value


LOGGERS = ("console", "tensorboard")


def _loggers(value: Any, _get: Get) -> Any:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list):
        return value
    kept = [n for n in names if n in LOGGERS]
    dropped = [n for n in names if n not in LOGGERS]
    if not dropped:
        return names  # a single name (logger=console) as the one-item list it means
    return Converted(
        kept or ["console"],
        f"ignored {', '.join(map(str, dropped))}: asyncrl logs to console and tensorboard "
        "(besides metrics.jsonl and the steps topic)",
    )


def _unset_is_default(why: str) -> Callable[[Any, Get], Any]:
    def convert(value: Any, _get: Get) -> Any:
        return Converted(DROP, why) if value is None else value

    return convert


def _turns(value: Any, get: Get) -> Any:
    if value is None:
        cap = get("data.max_response_length")
        return Converted(cap, f"verl's null (no limit) is data.max_response_length ({cap})")
    return value


OUR_KEYS: dict[str, tuple[str, Callable[[Any, Get], Any]]] = {
    "trainer.save_freq": ("verl's -1 (never) is 0 (only at the end)", _never_is_zero()),
    "trainer.test_freq": ("verl's -1 (never) is 0 (only at the end)", _never_is_zero()),
    "trainer.logger": (
        "console and tensorboard kept; others (wandb, swanlab, mlflow, ...) ignored",
        _loggers,
    ),
    "trainer.total_training_steps": (
        "verl's null: asyncrl's default, unless an alias sets it",
        _unset_is_default(
            "verl's null (from total_epochs): asyncrl's default unless an alias sets it"
        ),
    ),
    "actor_rollout_ref.rollout.name": (
        "sglang, trtllm refused (no such engine yet)",
        _engine,
    ),
    "algorithm.adv_estimator": (
        "gae, rloo, reinforce_plus_plus, ... refused (grpo only); left unset in a config "
        "with verl's own keys, a warning says grpo runs (verl's default is gae)",
        _estimator,
    ),
    "actor_rollout_ref.rollout.dtype": ("verl's bf16, fp16, fp32 named as torch does", _dtype),
    "actor_rollout_ref.actor.fsdp_config.dtype": (
        "verl's bf16, fp32 named as torch does",
        _dtype,
    ),
    "data.seed": (
        "verl's null: asyncrl's default seed",
        _unset_is_default("verl's null (unseeded): asyncrl's default seed"),
    ),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": (
        "verl's null (no limit) is data.max_response_length",
        _turns,
    ),
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": (
        "verl's null (no limit) is 0",
        _unset_is_default("verl's null (no limit): asyncrl's 0"),
    ),
}
"""verl's values of keys both have: (what happens, in words; the translation, or Refused)."""
