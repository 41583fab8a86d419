"""A Hugging Face checkpoint directory of a randomly initialised Qwen2 of a given shape, with the
demo's character tokenizer and chat template: a model-sized workload for `asyncrl run
actor_rollout_ref.model.path=...` where no real model can be downloaded (its answers are noise,
its step costs what the shape's do). Used by tools/gpu_check.sh.

    python tools/random_checkpoint.py --shape 500M --out /tmp/qwen-500m
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM

from asyncrl.bench.sync import SHAPES, qwen2_config
from asyncrl.models.policy import TINY_CHAT_TEMPLATE
from asyncrl.models.tiny import build_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="500M")
    parser.add_argument("--out", required=True, help="the checkpoint directory to write")
    args = parser.parse_args()
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    config = qwen2_config(args.shape, vocab_size=len(tokenizer))
    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.out}: {args.shape} shape, {params / 1e6:.0f}M parameters, vocab {len(tokenizer)}")


if __name__ == "__main__":
    main()
