"""Weight versions and weight transfer: control events drive pause/resume; tensors move by collective."""
