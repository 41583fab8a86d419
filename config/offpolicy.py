"""The off-policy sections of ``algorithm``: verl's rollout correction and DAPO's dynamic sampling.

Key names and meanings are verl's (``verl/trainer/config/algorithm.py``: RolloutCorrectionConfig
and FilterGroupsConfig, and ``verl/trainer/ppo/rollout_corr_helper.py``, at volcengine/verl
b178a3cd56f58b2d502255daba591e92833930a7); the maths lives in ``consumers/correction.py``.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from asyncrl.config.base import Strict

RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
"""verl's rejection criteria: where the divergence is taken (a token, or a trajectory's sum,
mean or max over its tokens) and which estimator of it (k1, k2, k3)."""


class _Empty(ValueError):
    """A k1 threshold whose bounds keep no ratio (lower >= upper)."""


class RolloutCorrectionConfig(Strict):
    """verl's ``algorithm.rollout_correction``: importance weights and rejection between the
    behaviour policy (the rollout's log-probs, each token under the weights of its segment) and
    the proximal policy (the trainer's log-probs: needs async_training.compute_prox_log_prob)."""

    rollout_is: Literal["token", "sequence"] | None = None
    """Importance weights pi_prox / pi_behaviour on the policy loss: token (one per token,
    exp(prox_t - behaviour_t)), sequence (one per trajectory, the product over its trained
    tokens), or null (none). With async_training.compute_prox_log_prob this is decoupled PPO."""
    rollout_is_threshold: float = Field(2.0, ge=1)
    """Weights above this are truncated to it (TIS); the share above it (and below its inverse)
    is logged as rollout_corr/rollout_is_ratio_fraction_high (_low). At least 1: below it even
    the weight of a token both policies agree on (1) would be cut, every token's loss scaled
    down."""
    rollout_is_batch_normalize: bool = False
    """Divide the truncated weights by their mean over the step's batch (tokens for token,
    trajectories for sequence), so they average 1."""
    rollout_rs: str | None = None
    """Rejection: tokens or trajectories whose divergence exceeds rollout_rs_threshold leave the
    loss (their mask is 0). Comma-separated, all must pass: token_k1..3, seq_sum_k1..3,
    seq_mean_k1..3, seq_max_k2..3 (k1 = log(pi_behaviour / pi_prox), k2 = k1^2 / 2,
    k3 = exp(-k1) - 1 + k1). null: no rejection."""
    rollout_rs_threshold: float | str | None = None
    """One threshold for every rollout_rs option, or one per option, comma-separated. A k1
    option takes ratio bounds: "lower_upper" (quote it: YAML reads 0.5_2 as the number 0.52),
    or one upper bound u (lower 1/u), compared in log space; k2/k3 take one upper bound."""

    @model_validator(mode="after")
    def _check_rs(self) -> RolloutCorrectionConfig:
        if self.rollout_rs is not None:
            self.rs_thresholds()  # raises with the key named
        return self

    def rs_options(self) -> list[str]:
        """The rejection criteria of ``rollout_rs``, each once, in the order given."""
        if self.rollout_rs is None:
            return []
        return list(dict.fromkeys(o.strip() for o in self.rollout_rs.split(",") if o.strip()))

    def rs_thresholds(self) -> dict[str, tuple[float | None, float]]:
        """Per criterion ``(lower, upper)``: k1 criteria have both (log space, as compared),
        the others ``(None, upper)``."""
        options = self.rs_options()
        key = "algorithm.rollout_correction"
        unknown = [o for o in options if o not in RS_OPTIONS]
        if not options or unknown:
            raise ValueError(
                f"{key}.rollout_rs={self.rollout_rs!r}: {unknown or 'no option'}; "
                f"choose among {', '.join(RS_OPTIONS)} (comma-separated)"
            )
        spec = self.rollout_rs_threshold
        if spec is None:
            raise ValueError(f"{key}.rollout_rs needs {key}.rollout_rs_threshold")
        raw = [str(spec)] if isinstance(spec, float | int) else spec.split(",")
        parts = [p.strip() for p in raw if p.strip()]
        if len(parts) not in (1, len(options)):
            raise ValueError(
                f"{key}.rollout_rs_threshold={spec!r}: give one threshold, or one per "
                f"rollout_rs option ({len(options)})"
            )
        parts = parts * len(options) if len(parts) == 1 else parts
        out: dict[str, tuple[float | None, float]] = {}
        for option, part in zip(options, parts, strict=True):
            where = f"{key}.rollout_rs_threshold for {option}"
            try:
                if option.endswith("k1"):
                    lower_s, _, upper_s = part.rpartition("_") if "_" in part else ("", "", part)
                    upper = float(upper_s)
                    lower = float(lower_s) if lower_s else 1.0 / upper
                    if lower <= 0 or upper <= 0:
                        raise ValueError
                    if lower >= upper:  # every token's ratio would be rejected
                        raise _Empty(
                            f"{where}: {part!r} leaves no ratio to keep (lower bound "
                            f"{lower:g} >= upper bound {upper:g}); "
                            + (
                                "a single bound u means 1/u..u: give u > 1"
                                if not lower_s
                                else "give 'lower_upper' with lower < upper"
                            )
                        )
                    out[option] = (math.log(lower), math.log(upper))
                else:
                    upper = float(part)
                    if upper <= 0 or "_" in part:  # two bounds are for k1 only
                        raise ValueError
                    out[option] = (None, upper)
            except _Empty:
                raise
            except ValueError:
                raise ValueError(
                    f"{where}: {part!r} is not a positive bound"
                    + (" or 'lower_upper'" if option.endswith("k1") else "")
                ) from None
        return out

    @property
    def enabled(self) -> bool:
        return self.rollout_is is not None or self.rollout_rs is not None


class FilterGroupsConfig(Strict):
    """verl's (DAPO's) ``algorithm.filter_groups``: dynamic sampling. A group whose trajectories
    all score the same has GRPO advantage 0 everywhere: it is left out of the batch, which is
    filled with further samples."""

    enable: bool = False
    """Dynamic sampling: a group whose trajectories all have the same metric (GRPO advantage 0)
    is left out of the batch, which is filled with further samples. Each such group is logged
    (SamplesDropped, reason filter_groups), and its worker takes its slot of the rollout budget
    back as it publishes it. Groups of one trajectory are kept (as DAPO). The sim engine's
    runs, which do not train, ignore it."""
    metric: str | None = None
    """What must differ within a group: score, seq_reward or seq_final_reward (the reward; the
    same here, there is no KL in the reward), a key the reward function returns in its dict
    (e.g. acc), or null (the reward). Trajectories whose reward failed are left out."""
    max_num_gen_batches: int = 0
    """Fail the run (as DAPO) when filling one step reads this many batches' worth of samples
    (x require_batches x ppo_mini_batch_size) and still lacks samples to train. <= 0: no limit."""
