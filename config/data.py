"""The ``data`` section: the task or the prompt files, lengths, and the prompts' order."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from asyncrl.config.base import Strict

COUNTDOWN_PROBLEMS = 630
"""The countdown task's problems (``asyncrl.tasks.countdown.PROBLEMS``; config sits below the
tasks and does not import them)."""


CHAT_TEMPLATE_ARGS = frozenset(
    {
        "conversation",
        "tools",
        "add_generation_prompt",
        "tokenize",
        "return_dict",
        "return_tensors",
        "continue_final_message",
        "return_assistant_tokens_mask",
    }
)
"""``apply_chat_template`` arguments asyncrl sets (or that change what it returns): not
``data.apply_chat_template_kwargs`` (a second ``tools`` would be a TypeError in every worker)."""


class DataConfig(Strict):
    task: Literal["arithmetic", "calculator", "countdown"] = "arithmetic"
    """The synthetic task: arithmetic (``07+35=``, single turn), calculator (``347*86=``,
    which the tiny model solves only by calling the calculator tool; needs
    actor_rollout_ref.rollout.multi_turn.enable=true), or countdown (``47-9=`` ->
    ``47,38,29,20,11,02``: responses of 6 to 102 tokens, a long tail; needs
    data.max_response_length of 102 or more to finish them all: --config countdown)."""
    train_size: int = Field(2000, ge=1)
    """Number of training prompts in one epoch."""
    val_size: int = Field(200, ge=1)
    """Number of held-out prompts used for accuracy."""
    seed: int = 0
    """Seed for the dataset split, the warm start and the training prompts' order (each
    epoch's shuffle, the same in an async run's feed and the colocated baseline)."""
    max_prompt_length: int = Field(16, ge=1, le=1 << 20)
    """Prompt tokens at most (up to 2^20). A prompt of data.train_files/val_files longer than
    this after its chat template is left out (counted; the launcher says how many); a built-in task's
    prompt keeps its last this-many tokens (verl's truncation="left")."""
    max_response_length: int = Field(6, ge=1, le=1 << 20)
    """Generation stops after this many response tokens (EOS included; at most 2^20)."""
    max_operand: int = Field(99, ge=1)
    """Operands of ``a+b=`` are drawn from 0..max_operand (99: two-digit addition with carries)."""
    train_files: str | list[str] | None = None
    """Training prompts: a verl-format parquet file, or a list of them (columns data_source,
    the prompt (data.prompt_key): chat messages [{role, content}] or a string, ability,
    reward_model {style, ground_truth}, extra_info). Set: replaces data.task's built-in
    prompts, and needs data.val_files. `asyncrl export-data` writes an example."""
    val_files: str | list[str] | None = None
    """Held-out prompts (the trainer's val/accuracy: the mean reward of its greedy answers),
    same format as data.train_files; needed with it."""
    prompt_key: str = "prompt"
    """The column of data.train_files/val_files holding each prompt."""
    apply_chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments of every chat template call, as verl passes them: a chat
    prompt's (workers, held-out evaluation, the length filter) and the agent loop's framing of
    tool responses and user replies; e.g. enable_thinking: false for Qwen3 (verl's override:
    +data.apply_chat_template_kwargs.enable_thinking=False). The template reads them as
    variables: one it does not use changes nothing, and the built-in model's ignores all."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch (seeded by data.seed); false: file order."""
    feed_ahead_steps: int = Field(1000, ge=0)
    """Steps' worth of prompts on the prompts topic ahead of the trainer: the set-up feeds
    this many steps' (twice their samples), and the trainer feeds the rest as it trains. 0:
    every step's up front (a 20K-step run: 320K prompts, a minute, before its first step)."""

    @field_validator("apply_chat_template_kwargs")
    @classmethod
    def _not_ours(cls, values: dict[str, Any]) -> dict[str, Any]:
        for key in values:
            if key in CHAT_TEMPLATE_ARGS:
                raise ValueError(
                    f"{key}: set by asyncrl itself (the prompt's messages, the tool schemas, the "
                    "generation prompt, text out); the kwargs are for the template's own "
                    "variables (enable_thinking, ...)"
                )
        return values

    @model_validator(mode="after")
    def _check_files(self) -> DataConfig:
        if (self.train_files is None) != (self.val_files is None):
            missing, given = ("val_files", "train_files")[:: 1 if self.val_files is None else -1]
            raise ValueError(
                f"data.{missing} is needed with data.{given} (the trainer's held-out accuracy "
                "reads data.val_files)"
            )
        for name in ("train_files", "val_files"):
            if getattr(self, name) == []:
                raise ValueError(f"data.{name} is an empty list")
        asked = self.train_size + self.val_size
        if self.task == "countdown" and not self.from_files and asked > COUNTDOWN_PROBLEMS:
            raise ValueError(
                f"data.train_size + data.val_size = {asked}: the countdown task has "
                f"{COUNTDOWN_PROBLEMS} problems (its config: 530 + 100)"
            )
        return self

    @property
    def from_files(self) -> bool:
        """Prompts come from data.train_files/val_files, not from data.task's generator."""
        return self.train_files is not None

    @property
    def train_paths(self) -> list[str]:
        return file_paths(self.train_files)

    @property
    def val_paths(self) -> list[str]:
        return file_paths(self.val_files)


def file_paths(value: str | list[str] | None) -> list[str]:
    """data.train_files/val_files as a list: one file, a list of them, or none."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)
