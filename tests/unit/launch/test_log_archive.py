"""The archive's file format: records round-trip byte for byte, and a write cut by a crash
ends the file there (reopening truncates it and appends after the last whole record)."""

from __future__ import annotations

from asyncrl.launch.log_archive import ArchivedRecord, PartitionFile, read_partition


def records(n: int, start: int = 0) -> list[ArchivedRecord]:
    return [
        ArchivedRecord(
            offset=start + i,
            timestamp_ms=1_700_000_000_000 + i,
            key=None if i % 3 == 0 else f"k{i}".encode(),
            value=None if i == 4 else bytes(range(i % 256)) * 3,
            headers=[("asyncrl-schema", b"sample/3"), ("traceparent", b"")][: i % 3],
        )
        for i in range(n)
    ]


def test_records_round_trip(tmp_path):
    f = PartitionFile(tmp_path / "t" / "0.log")
    for rec in records(7):
        f.append(rec)
    f.close()
    assert list(read_partition(tmp_path / "t" / "0.log")) == records(7)
    assert PartitionFile(tmp_path / "t" / "0.log").next_offset == 7


def test_a_torn_last_record_is_dropped_and_appending_goes_on(tmp_path):
    path = tmp_path / "t" / "0.log"
    f = PartitionFile(path)
    for rec in records(3):
        f.append(rec)
    f.close()
    whole = path.stat().st_size
    with open(path, "ab") as raw:
        raw.write(b"\x40\x00\x00\x00\x01\x02")  # a frame whose body never made it to disk
    again = PartitionFile(path)
    assert again.next_offset == 3 and path.stat().st_size == whole
    again.append(records(4)[3])
    again.close()
    assert [r.offset for r in read_partition(path)] == [0, 1, 2, 3]


def test_a_corrupt_record_ends_the_readable_log(tmp_path):
    path = tmp_path / "t" / "0.log"
    f = PartitionFile(path)
    for rec in records(3):
        f.append(rec)
    f.close()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the last record's body no longer matches its checksum
    path.write_bytes(bytes(data))
    assert [r.offset for r in read_partition(path)] == [0, 1]
