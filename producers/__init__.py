"""Rollout side: workers that turn prompts into scored samples on an inference engine."""
