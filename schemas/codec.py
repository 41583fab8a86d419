"""Arrow IPC encoding shared by every message type, with a schema version on each message.

Each message is one Arrow IPC stream holding one record batch. The schema name and version
travel twice: in the Kafka header ``asyncrl-schema`` (so a reader can route before decoding)
and in the Arrow schema metadata (so a message is self-describing on disk or in replay).
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_HEADER = "asyncrl-schema"
METADATA_KEY = b"asyncrl.schema"


class DecodeError(ValueError):
    """A message that does not decode to the schema it claims; routed to the dead-letter topic."""


def schema_tag(name: str, version: int) -> str:
    return f"{name}/{version}"


def with_tag(schema: pa.Schema, name: str, version: int) -> pa.Schema:
    return schema.with_metadata({METADATA_KEY: schema_tag(name, version).encode()})


_WRITE_OPTIONS = pa.ipc.IpcWriteOptions()
"""Given to every writer: without options, pyarrow reads ten environment variables per
message to pick its defaults (15% of encoding a prompt; the feed encodes millions)."""


def encode_batch(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_batch(
    data: bytes | None,
    expected: pa.Schema,
    tag: str,
    headers: dict[str, bytes] | None = None,
) -> pa.RecordBatch:
    """Decode one IPC stream and check it is exactly ``expected`` (fields and schema tag).

    The Kafka ``asyncrl-schema`` header, when the message has one, must name the same tag as
    the Arrow metadata: readers route by the header, so a message whose header claims another
    schema (a copy edited on the way, a producer's bug) is rejected rather than trusted.
    """
    if not data:
        raise DecodeError(f"{tag}: empty message")
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as err:
        raise DecodeError(f"{tag}: not an Arrow IPC stream ({err})") from None
    if len(batches) != 1:
        raise DecodeError(f"{tag}: expected 1 record batch, got {len(batches)}")
    batch = batches[0]
    got_tag = (batch.schema.metadata or {}).get(METADATA_KEY, b"").decode(errors="replace")
    if got_tag != tag:
        raise DecodeError(f"expected schema {tag}, message says {got_tag or 'nothing'}")
    header = (headers or {}).get(SCHEMA_HEADER)
    if header is not None and header.decode(errors="replace") != got_tag:
        raise DecodeError(
            f"schema header says {header.decode(errors='replace')!r}, the message is {got_tag}"
        )
    if not batch.schema.equals(expected, check_metadata=False):
        raise DecodeError(f"{tag}: fields differ from the schema: {batch.schema.names}")
    try:  # offsets within their values, valid UTF-8: what readers index without checking
        batch.validate(full=True)
    except pa.ArrowInvalid as err:
        raise DecodeError(f"{tag}: invalid Arrow data ({err})") from None
    columns = zip(batch.schema, batch.columns, strict=True)
    nulls = [f.name for f, c in columns if not f.nullable and c.null_count]
    if nulls:
        raise DecodeError(f"{tag}: null values in non-nullable column(s) {nulls}")
    return batch
