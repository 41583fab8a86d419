"""A transformers/torch engine: one batched forward per step over every active sequence.

No KV cache: each step recomputes the full (left-padded) sequences. The demo's sequences are
~12 tokens, so this costs little, and it keeps the engine trivially correct across weight swaps
and continuations (there is no cache that could go stale when ``model`` changes under it).
``hf_cached`` (:mod:`asyncrl.producers.engines.cached`) is this engine with a KV cache.
The logprob of each chosen token is ``log_softmax(logits / T)[token]``, the same quantity the
trainer recomputes with :func:`asyncrl.consumers.grpo.token_logprobs`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from asyncrl.producers.engines.base import ActiveRequest, GenResult, StepwiseEngine


def left_pad(
    seqs: list[list[int]], pad_token_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad ``seqs`` to one width: (input_ids, attention_mask, position_ids).

    Positions count real tokens only (0 at each sequence's first real token), so a sequence
    gets the same positions, hence the same logits, whatever it is batched with.
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def filtered_probs(probs: torch.Tensor, top_p: float = 1.0, top_k: int = -1) -> torch.Tensor:
    """``probs`` ``[B, V]`` with the tokens outside the ``top_k`` most likely (k <= 0: all)
    and outside the nucleus (the most likely tokens whose mass reaches ``top_p``, the one
    crossing it included) zeroed, as vLLM filters; unchanged when both are off."""
    if top_p >= 1.0 and top_k <= 0:
        return probs
    ordered, order = probs.sort(dim=-1, descending=True)
    keep = torch.ones_like(ordered, dtype=torch.bool)
    if top_k > 0:
        keep[:, top_k:] = False
    if top_p < 1.0:
        before = ordered.cumsum(-1) - ordered  # the mass of the more likely tokens
        keep &= before < top_p
    kept = torch.zeros_like(probs).scatter(-1, order, ordered * keep)
    return kept


class HFEngine(StepwiseEngine):
    """Stepwise sampler over a causal LM (see :class:`asyncrl.producers.engines.base.Engine`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase | None,
        temperature: float,
        eos_token_id: int | Sequence[int],
        pad_token_id: int,
        seed: int = 0,
        emulated_decode_latency_s: float = 0.0,
        top_p: float = 1.0,
        top_k: int = -1,
    ) -> None:
        if temperature <= 0:
            raise ValueError("temperature must be > 0 (use GenRequest.greedy for argmax)")
        self.top_p, self.top_k = top_p, top_k
        """Nucleus and top-k filtering of the sampled tokens (a validation's val_kwargs; 1.0
        and -1: off). Rollouts for training sample the whole distribution, whose logprobs the
        trainer recomputes."""
        super().__init__(model, eos_token_id)
        self.tokenizer = tokenizer
        self.temperature = float(temperature)
        self.pad_token_id = pad_token_id
        self.seed = seed
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        """Sampling draws on the CPU; a GPU's logits get a generator of their device
        (``_generator``), seeded alike, so that only the chosen tokens leave the GPU."""
        self._device_generator: torch.Generator | None = None
        self.emulated_decode_latency_s = emulated_decode_latency_s

    @torch.no_grad()
    def step(self) -> list[GenResult]:
        finished = self._take_complete()
        if not self._active:
            return finished
        actives = list(self._active.values())
        device = next(self.model.parameters()).device
        ids, mask, pos = left_pad(
            [a.req.prompt_ids + a.ids for a in actives], self.pad_token_id, device
        )
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        return finished + self._choose(actives, logits[:, -1, :])

    def _choose(self, actives: list[ActiveRequest], logits: torch.Tensor) -> list[GenResult]:
        """Sample (or take the argmax of) each active request's next token from its row of
        ``logits`` ``[B, V]``, record its logprob; returns the requests that finished."""
        if self.emulated_decode_latency_s:
            time.sleep(self.emulated_decode_latency_s)
        # On the logits' device: a GPU sends back two numbers per row, not [B, vocab] floats.
        logp = torch.log_softmax(logits.float() / self.temperature, dim=-1)
        probs = filtered_probs(logp.exp(), self.top_p, self.top_k)
        sampled = torch.multinomial(probs, 1, generator=self._generator(logp.device))
        greedy = torch.tensor([a.req.greedy for a in actives], device=logp.device)
        chosen = torch.where(greedy, logp.argmax(-1), sampled.squeeze(-1))
        chosen_logp = logp.gather(-1, chosen[:, None]).squeeze(-1)
        finished = []
        for a, tok, lp in zip(actives, chosen.tolist(), chosen_logp.tolist(), strict=True):
            result = self._append(a, tok, lp)
            if result is not None:
                finished.append(result)
        return finished

    def _generator(self, device: torch.device) -> torch.Generator:
        """The sampling generator for ``device``: ``self.generator`` on the CPU, else one of
        that device, made on first use with the same seed."""
        if device.type == "cpu":
            return self.generator
        if self._device_generator is None or self._device_generator.device != device:
            self._device_generator = torch.Generator(device=device).manual_seed(self.seed)
        return self._device_generator
