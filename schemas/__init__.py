"""The wire contract between producers and consumers: Arrow schemas and event types.

Depends on pyarrow and numpy only (a test asserts torch is not imported), so any process or
tool can decode the log. One module per message type; each exports its schema, tag and codec.
"""

from asyncrl.schemas import control, partial, prompt, sample, step
from asyncrl.schemas.codec import SCHEMA_HEADER, DecodeError

__all__ = ["SCHEMA_HEADER", "DecodeError", "control", "partial", "prompt", "sample", "step"]
