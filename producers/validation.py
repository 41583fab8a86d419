"""Held-out evaluation on the rollout side (``async_training.use_trainer_do_validate=false``,
verl's fully async default: its Rollouter validates after a parameter update).

Worker 0 evaluates the weights it has just taken when they are the first of a new multiple of
``trainer.test_freq`` steps (step 0: the initial accuracy; with a sync every 4 steps and
test_freq 5, the weights of steps 0, 8, 12, 16, 20, ...: a sync cadence that does not divide
test_freq skips no evaluation), with the same evaluation the trainer runs
(``held_out_accuracy``), and publishes the result as a Validated event. It generates on the
rollout's kind of engine (``producers.agent.eval_engine``): with rollout.name=vllm on the
worker's own engine, which holds the weights just loaded, its requests beside the rollout's
still in flight. The evaluation holds up this worker's admission of new prompts for its
duration (verl: "it occupies Rollouter resources"), not the trainer's updates.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from asyncrl.config import RunConfig
from asyncrl.schemas import control as ev
from asyncrl.sync.channel import ControlChannel

if TYPE_CHECKING:
    from asyncrl.producers.engines.base import Engine

log = logging.getLogger(__name__)


class RolloutValidator:
    def __init__(
        self, cfg: RunConfig, worker_id: int, control: ControlChannel, tokenizer: Any
    ) -> None:
        self.cfg = cfg
        self.worker_id = worker_id
        self.control = control
        self.tokenizer = tokenizer
        freq = cfg.trainer.test_freq
        self.enabled = (
            not cfg.async_training.use_trainer_do_validate
            and worker_id == 0
            and freq > 0
            and cfg.actor_rollout_ref.rollout.name != "sim"  # the sim engine learns nothing
        )
        self.problems: list | None = None
        self.evaluated = -1
        """``step // test_freq`` of the weights evaluated last (a rejoin may take them again)."""

    def after_load(self, published: ev.WeightsPublished, engine: Engine) -> None:
        """Evaluate ``engine``'s model (the weights of ``published``) if its step is due: the
        first weights at or past a multiple of test_freq not evaluated yet."""
        if not self.enabled:
            return
        due = published.step // self.cfg.trainer.test_freq
        if due <= self.evaluated:
            return
        from asyncrl.producers.agent.factory import held_out_accuracy, held_out_set

        self.evaluated = due
        if self.problems is None:
            self.problems = held_out_set(self.cfg, self.tokenizer)
        t0 = time.monotonic()
        measured = held_out_accuracy(
            self.cfg, engine.model, self.tokenizer, self.problems, running=engine
        )
        took = time.monotonic() - t0
        self.control.publish(
            ev.Validated(
                run_id=self.cfg.run_id,
                version=published.version,
                worker=self.worker_id,
                step=published.step,
                accuracy=measured["accuracy"],
                tool_use=measured.get("tool_use", -1.0),
                eval_s=took,
            ),
            flush=False,
        )
        log.info(
            "held-out accuracy of version %d (step %d): %.3f (%.2f s)",
            published.version,
            published.step,
            measured["accuracy"],
            took,
        )
