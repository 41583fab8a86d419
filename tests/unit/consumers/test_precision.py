"""The trainer's compute precision (verl's actor_rollout_ref.actor.fsdp_config.dtype): bf16
autocast for the forward passes, float32 weights, gradients and optimizer state; float32
throughout by default on the CPU."""

import copy
import random

import pytest
import torch

from asyncrl.config import ModelConfig, load_config
from asyncrl.consumers.grpo import build_batch
from asyncrl.consumers.precision import compute_dtype
from asyncrl.consumers.update import policy_step
from asyncrl.models.tiny import build_model

VOCAB = 30
BF16 = ["actor_rollout_ref.actor.fsdp_config.dtype=bfloat16"]


def _batch(n: int = 8, seed: int = 0):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt = [1, *(rng.randrange(4, VOCAB) for _ in range(rng.randrange(1, 9)))]
        response = [rng.randrange(4, VOCAB) for _ in range(rng.randrange(1, 13))]
        rows.append((prompt, response, [-2.0] * len(response), rng.uniform(-1.5, 1.5)))
    return build_batch(rows, pad_token_id=0)


def _step(overrides: list[str], model, batch):
    """One SGD step (the update is the gradient), recording the dtype of every Linear's
    output in the forward passes."""
    cfg = load_config(overrides=["async_training.use_rollout_log_probs=false", *overrides])
    model = copy.deepcopy(model)
    seen: set[torch.dtype] = set()
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    grads: dict[str, torch.dtype] = {}

    def record(name: str):
        def hook(grad: torch.Tensor) -> None:
            grads.setdefault(name, grad.dtype)

        return hook

    for name, p in model.named_parameters():
        p.register_hook(record(name))
    metrics = policy_step(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, cfg)
    for h in hooks:
        h.remove()
    return model, metrics, seen, grads


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig(hidden_size=32, intermediate_size=64), VOCAB, 0)


def test_on_the_cpu_the_trainer_computes_in_float32_by_default(model):
    cfg = load_config()
    assert cfg.actor_rollout_ref.actor.fsdp_config.dtype == "auto"
    assert compute_dtype(cfg, torch.device("cpu")) == torch.float32
    assert compute_dtype(cfg, torch.device("cuda")) == torch.bfloat16  # verl's default on GPUs
    _, _, seen, grads = _step([], model, _batch())
    assert seen == {torch.float32} and set(grads.values()) == {torch.float32}


def test_bf16_computes_the_forward_in_bf16_and_keeps_float32_weights_and_gradients(model):
    batch = _batch()
    ref, m_ref, _, _ = _step([], model, batch)
    got, m_got, seen, grads = _step(BF16, model, batch)
    assert seen == {torch.bfloat16}  # every matmul of both passes (old log-probs, update)
    assert set(grads.values()) == {torch.float32} and len(grads) == len(list(got.parameters()))
    assert {p.dtype for p in got.parameters()} == {torch.float32}
    # The same update to bf16 rounding: not bit-equal (it did compute in bf16), but close.
    moved = [(p - q).abs().max() for p, q in zip(got.parameters(), model.parameters(), strict=True)]
    diffs = [(p - q).abs().max() for p, q in zip(got.parameters(), ref.parameters(), strict=True)]
    assert max(diffs) > 0
    assert max(diffs) < 0.1 * max(moved)
    assert m_got["pg_loss"] == pytest.approx(m_ref["pg_loss"], abs=0.05)


@pytest.mark.parametrize("short, name", [("bf16", "bfloat16"), ("fp32", "float32")])
def test_verls_short_dtype_names_are_read(short, name):
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.actor.fsdp_config.dtype={short}",
            f"actor_rollout_ref.rollout.dtype={short}",
            "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
        ]
    )
    assert cfg.actor_rollout_ref.actor.fsdp_config.dtype == name
    assert cfg.actor_rollout_ref.rollout.dtype == name


def test_a_trainer_in_half_precision_weights_is_refused_naming_the_key():
    from asyncrl.config import ConfigError

    with pytest.raises(ConfigError, match="fsdp_config.model_dtype"):
        load_config(overrides=["actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"])
    with pytest.raises(ConfigError, match="fsdp_config.dtype"):
        load_config(overrides=["actor_rollout_ref.actor.fsdp_config.dtype=fp16"])
