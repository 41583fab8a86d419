"""Held-out evaluation on the trainer's side: when it runs and what it records.

Every ``trainer.test_freq`` steps, and once before the first step, unless the rollout side
evaluates (``async_training.use_trainer_do_validate=false``: worker 0 publishes Validated) or
the run is simulated (the sim engine learns nothing). The latest figures are kept in the
trainer's ``history`` (so a restarted trainer reports them) and in the step's metrics.
"""

from __future__ import annotations

from typing import Any

import torch

from asyncrl.config import RunConfig


class TrainerEvaluation:
    def __init__(self, cfg: RunConfig, tokenizer: Any, history: dict[str, Any], simulated: bool):
        from asyncrl.producers.agent.factory import held_out_set

        self.cfg = cfg
        self.tokenizer = tokenizer
        self.history = history
        self.problems = held_out_set(cfg, tokenizer)
        on_trainer = cfg.async_training.use_trainer_do_validate and not simulated
        self.freq = cfg.trainer.test_freq if on_trainer else 0
        self.tool_use: float | None = None
        """The agent loop's tool-use rate at the latest evaluation (multi_turn only)."""
        self.per_source: dict[str, float] = {}
        """With data.val_files: each data source's mean reward at the latest evaluation."""

    def measure(self, model: torch.nn.Module) -> float:
        """Held-out accuracy (the agent loop with its tools when multi_turn is on; its
        tool-use rate too), kept in ``history`` as the latest."""
        from asyncrl.producers.agent.factory import held_out_accuracy

        model.eval()
        measured = held_out_accuracy(self.cfg, model, self.tokenizer, self.problems)
        model.train()
        self.tool_use = measured.get("tool_use", self.tool_use)
        self.history["val/accuracy"] = measured["accuracy"]
        self.per_source = {k: v for k, v in measured.items() if k.startswith("val-core/")}
        if self.tool_use is not None:
            self.history["val/tool_use"] = self.tool_use
        return measured["accuracy"]

    def initial(self, model: torch.nn.Module) -> float | None:
        """The accuracy before training (or the latest one of a resumed run)."""
        accuracy = self.history.get("val/accuracy")
        if accuracy is None and self.freq:
            accuracy = self.history["val/accuracy_initial"] = self.measure(model)
            if self.tool_use is not None:
                self.history["val/tool_use_initial"] = self.tool_use
        return accuracy

    def after_step(
        self, step: int, model: torch.nn.Module, metrics: dict[str, float]
    ) -> float | None:
        """Evaluate if ``step`` is due, adding the figures to ``metrics``; the accuracy, or
        None if not due."""
        if not self.freq or step % self.freq:
            return None
        accuracy = metrics["val/accuracy"] = self.measure(model)
        if self.tool_use is not None:
            metrics["val/tool_use"] = self.tool_use
        metrics.update(self.per_source)
        return accuracy
