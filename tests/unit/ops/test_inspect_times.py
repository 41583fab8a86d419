"""``--since``/``--until`` of ``asyncrl inspect`` and ``replay topic``: the forms a user types."""

from datetime import datetime, timezone

import pytest

from asyncrl.ops.inspect_log import parse_time

NOW = datetime(2026, 11, 26, 15, 30, 0, tzinfo=timezone.utc)


def _ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=timezone.utc).timestamp() * 1000)


def test_a_time_of_day_as_the_tables_show_it_is_the_latest_such_moment():
    assert parse_time("15:03:46", NOW) == _ms(2026, 11, 26, 15, 3, 46)
    assert parse_time("15:03:46.250", NOW) == _ms(2026, 11, 26, 15, 3, 46) + 250
    assert parse_time("23:59:00", NOW) == _ms(2026, 11, 25, 23, 59, 0)  # later today: yesterday


def test_iso_times_and_epoch_ms_read_as_before():
    assert parse_time("2026-11-22T07:49:57", NOW) == _ms(2026, 11, 22, 7, 49, 57)
    assert parse_time("2026-11-22T08:49:57+01:00", NOW) == _ms(2026, 11, 22, 7, 49, 57)
    assert parse_time("1700000000000", NOW) == 1700000000000


def test_anything_else_is_refused_naming_the_forms():
    with pytest.raises(ValueError, match=r"not a time: 'yesterday' \(epoch ms, ISO 8601"):
        parse_time("yesterday", NOW)
