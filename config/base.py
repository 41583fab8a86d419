"""What every config section shares: strict models (unknown keys are errors), the error type, and
where the embedded default config lives."""

from __future__ import annotations

from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
)

import asyncrl

DEFAULT_CONFIG = Path(asyncrl.__file__).resolve().parent / "configs" / "default.yaml"
"""The embedded demo's config; the shipped configs beside it load by name (``calculator``)."""


MAX_WAIT_S = 7 * 24 * 3600
"""The longest timeout a key takes (a week): more is no timeout a user means, and torch's
rendezvous and Python's waits overflow on the likes of 1e300 s, late in a run's start."""


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors, not silently ignored, and a
    float key refuses inf and nan (``gt=0`` lets ``inf`` through, which no key means: an
    infinite lr, or a sample budget that overflows)."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        use_attribute_docstrings=True,
        allow_inf_nan=False,
    )


class ConfigError(ValueError):
    """A config that cannot be loaded; the message names the offending key."""
