"""The ``actor_rollout_ref.model`` section: a checkpoint, or the built-in tiny model and its warm start."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from asyncrl.config.base import Strict


def _head_counts(hidden: int, most: int = 4) -> list[int]:
    """Up to ``most`` head counts that split ``hidden`` into an even head width."""
    return [h for h in range(1, hidden + 1) if hidden % h == 0 and (hidden // h) % 2 == 0][:most]


class ModelConfig(Strict):
    path: str | None = None
    """A local Hugging Face checkpoint directory (config.json, weights, tokenizer and its chat
    template), or a Hub id (org/name) already in the local Hugging Face cache (nothing is
    downloaded): the trainer loads it with transformers in float32, the rollout workers
    straight in rollout.dtype (no float32 copy first), no warm start. None: the built-in tiny
    model (the fields below), warm-started on data.task."""
    trust_remote_code: bool = False
    """Let transformers run the model's own code from actor_rollout_ref.model.path."""
    override_config: dict[str, int | float | bool | str] = Field(default_factory=dict)
    """Values set over the checkpoint's config.json when the trainer and the workers load it
    (verl's key: DAPO's max_position_embeddings=32768 for long responses, dropouts 0...);
    only with path (the built-in model has its own keys)."""
    hidden_size: int = Field(128, ge=8)
    """Width of the demo Qwen2 model built locally (no hub download)."""
    num_hidden_layers: int = Field(2, ge=1)
    """Transformer layers of the demo model."""
    num_attention_heads: int = Field(4, ge=1, validate_default=True)
    """Attention heads of the demo model (must divide hidden_size into an even head width)."""

    @field_validator("num_attention_heads")
    @classmethod
    def _divides_hidden_size(cls, heads: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden_size")
        if hidden is not None and (hidden % heads or (hidden // heads) % 2):
            raise ValueError(
                f"must divide actor_rollout_ref.model.hidden_size={hidden} into an even head "
                "width (rotary embeddings rotate pairs of dimensions), e.g. "
                f"{', '.join(str(h) for h in _head_counts(hidden))}"
            )
        return heads

    @field_validator("override_config")
    @classmethod
    def _needs_a_checkpoint(cls, values: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if values and info.data.get("path") is None:
            raise ValueError(
                "applies to the checkpoint of actor_rollout_ref.model.path, which is unset (the "
                "built-in model takes hidden_size, num_hidden_layers, ... instead)"
            )
        return values

    intermediate_size: int = Field(256, ge=8)
    """MLP width of the demo model."""
    warmup_steps: int = Field(1500, ge=0)
    """Supervised warm-start steps on the task before RL."""
    warmup_drop_carry_prob: float = Field(0.8, ge=0, le=1)
    """The warm start's teacher drops the carries of its answer with this probability, so the
    warm policy carries too rarely for greedy decoding (~30-40% held-out accuracy) but often
    enough when sampling for RL to fix it. 0: a correct teacher."""
    warmup_tool_prob: float = Field(0.3, ge=0, le=1)
    """calculator task: the warm start's teacher calls the tool with this probability (and
    guesses otherwise), so RL has a minority of rewarded tool-using samples to learn from."""
    warmup_lr: float = Field(1e-3, gt=0)
    """AdamW learning rate of the supervised warm start."""
    warmup_batch_size: int = Field(64, ge=1)
    """Problems per supervised warm-start step."""
    warmup_target_accuracy: float | None = Field(None, gt=0, le=1)
    """Stop the warm start early once greedy accuracy on a probe of training prompts reaches
    this (checked every warmup_eval_every steps); None: run all warmup_steps."""
    warmup_eval_every: int = Field(10, ge=1)
    """Warm-start steps between two probe-accuracy checks for the early stop."""
    cache_dir: str | None = None
    """Where the warm-started model is cached (default ~/.cache/asyncrl/models)."""
