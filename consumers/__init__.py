"""Trainer side: read samples, filter by staleness, batch, compute advantages, update."""
