"""Policy models built locally (no hub download): tokenizer, tiny causal LM, warm start."""
