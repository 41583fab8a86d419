"""Ways of moving a transfer's weights from the trainer to a worker, one file each, behind
the interface in ``base``."""
