"""Inference engines: generate token ids with logprobs, interruptible, reloadable."""
