"""``asyncrl inspect samples --text``: a table cell of decoded responses shows their text,
not JSON's \\u escapes of every character outside ASCII (a Chinese answer read as \\u7b54...,
a byte-level model's stray byte as \\ufffd)."""

from __future__ import annotations

from asyncrl.ops.inspect_log import _cell


def test_a_cell_of_decoded_text_reads_as_the_text() -> None:
    assert _cell(["答案是 42", "naïve\ufffd"]) == '["答案是 42", "naïve\ufffd"]'
    assert _cell({"ok": "✓"}) == '{"ok": "✓"}'
    assert _cell(["a\nb"]) == '["a\\nb"]'  # one line per cell still: control characters escaped
