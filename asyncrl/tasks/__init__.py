"""Synthetic tasks shipped with asyncrl: datasets, prompts and rule-based rewards."""
