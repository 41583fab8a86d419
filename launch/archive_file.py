"""Where a run's archived log lives, and its files: one per topic partition, and the groups'
offsets.

File format (no pickle: records are read back by a fixed layout): a magic line, then per
record ``u32 length, u32 crc32`` of the body, and the body ``i64 offset, i64 timestamp_ms,
i32 key length (-1: none), key, i32 value length (-1: none), value, u16 header count`` and
per header ``u16 name length, name, u32 value length, value``. A body whose checksum does
not match (a write cut by a crash) ends the file: it is truncated there when reopened.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from asyncrl.config import RunConfig

MAGIC = b"asyncrl-log/1\n"
GROUPS_FILE = "groups.json"
_FRAME = struct.Struct("<II")
_FIXED = struct.Struct("<qq")
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")


class ArchiveError(RuntimeError):
    """An archive that cannot be read back or restored as it was written."""


@dataclass
class ArchivedRecord:
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def log_dir(cfg: RunConfig) -> Path:
    return cfg.run_dir / "log"


def has_archive(cfg: RunConfig) -> bool:
    return any(log_dir(cfg).glob("*/*.log"))


def _encode(rec: ArchivedRecord) -> bytes:
    parts = [_FIXED.pack(rec.offset, rec.timestamp_ms)]
    for blob in (rec.key, rec.value):
        parts.append(_I32.pack(-1 if blob is None else len(blob)))
        if blob is not None:
            parts.append(blob)
    parts.append(_U16.pack(len(rec.headers)))
    for name, value in rec.headers:
        raw = name.encode()
        parts += [_U16.pack(len(raw)), raw, _U32.pack(len(value)), value]
    body = b"".join(parts)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def _decode(body: bytes) -> ArchivedRecord:
    offset, ts = _FIXED.unpack_from(body, 0)
    pos = _FIXED.size
    blobs: list[bytes | None] = []
    for _ in range(2):
        (n,) = _I32.unpack_from(body, pos)
        pos += _I32.size
        if n < 0:
            blobs.append(None)
        else:
            blobs.append(body[pos : pos + n])
            pos += n
    (count,) = _U16.unpack_from(body, pos)
    pos += _U16.size
    headers = []
    for _ in range(count):
        (n,) = _U16.unpack_from(body, pos)
        pos += _U16.size
        name = body[pos : pos + n].decode()
        pos += n
        (m,) = _U32.unpack_from(body, pos)
        pos += _U32.size
        headers.append((name, body[pos : pos + m]))
        pos += m
    return ArchivedRecord(offset, ts, blobs[0], blobs[1], headers)


def _scan(path: Path) -> Iterator[tuple[int, ArchivedRecord]]:
    """(end position, record) of every intact record of one partition file."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ArchiveError(f"{path} is not an asyncrl log archive file")
        while True:
            frame = f.read(_FRAME.size)
            if len(frame) < _FRAME.size:
                return
            length, crc = _FRAME.unpack(frame)
            body = f.read(length)
            if len(body) < length or zlib.crc32(body) != crc:
                return  # a write cut short by a crash: the file ends before it
            yield f.tell(), _decode(body)


def read_partition(path: Path) -> Iterator[ArchivedRecord]:
    for _end, rec in _scan(path):
        yield rec


def archived_partitions(directory: Path) -> dict[tuple[str, int], Path]:
    """``{(topic, partition): file}`` of an archive directory."""
    return {
        (p.parent.name, int(p.stem)): p
        for p in sorted(directory.glob("*/*.log"))
        if p.stem.isdigit()
    }


class PartitionFile:
    """One partition's append-only file; reopening truncates a torn last record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.next_offset = 0
        end = len(MAGIC)
        if path.exists():
            for pos, rec in _scan(path):
                end, self.next_offset = pos, rec.offset + 1
            with open(path, "r+b") as f:
                f.truncate(end)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(MAGIC)
        self._file: BinaryIO = open(path, "ab")  # noqa: SIM115 (closed in close())

    def append(self, rec: ArchivedRecord) -> None:
        self._file.write(_encode(rec))
        self.next_offset = rec.offset + 1

    def flush(self) -> None:
        """Hand what was appended to the OS: it then outlives a killed process (not a
        crashed machine: ``sync``)."""
        self._file.flush()

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()


def _groups(cfg: RunConfig) -> dict[str, str]:
    """Consumer group -> the topic whose offsets it commits."""
    return {
        f"{cfg.run_id}.rollout": cfg.topic("prompts"),
        f"{cfg.run_id}.trainer": cfg.topic("samples"),
    }


def write_group_offsets(directory: Path, saved: dict[str, dict[str, int]]) -> None:
    tmp = directory / f".{GROUPS_FILE}.tmp"
    directory.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(saved, indent=1))
    tmp.replace(directory / GROUPS_FILE)
