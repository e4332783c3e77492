"""How the retry pass reads lines (opstate.retry.reading): the same rows as ``json.loads`` of
the line would give the rules, with only the fields the rules use built; strictly (a line a
strict JSON parser refuses is unreadable); and keys as digests."""

from __future__ import annotations

import json
from typing import Any

import pytest

from opstate.retry import reading
from opstate.retry.reading import KeyIndex, final_line, key_of, read_output, utf8_error
from opstate.retry.rules import read_row, row_of

TEXT = {"text": "x" * 200}
ROWS: list[dict[str, Any]] = [
    {"key": "a", "response": {"candidates": [{"content": {"parts": [TEXT]}}]}},
    {"key": "b", "response": {"candidates": [{"finishReason": "SAFETY", "content": TEXT}]}},
    {"key": "c", "response": {"promptFeedback": {"blockReason": "OTHER"}, "x": [TEXT]}},
    {"key": "d", "response": {"promptFeedback": {"blockReason": ""}, "candidates": [TEXT]}},
    {"key": "e", "response": {"candidates": None, "x": [TEXT]}},
    {"key": "f", "response": {"candidates": "odd", "x": [TEXT]}},
    {"key": "g", "response": {"candidates": [5, {"finishReason": "STOP"}], "x": [TEXT]}},
    {"key": "h", "response": {"promptFeedback": 3, "candidates": [], "x": [TEXT]}},
    {"key": "i", "error": {"code": 429, "message": "Resource exhausted " * 20, "status": "X"}},
    {"key": "j", "status": {"code": "UNAVAILABLE", "message": ["not text"], "x": [TEXT]}},
    {"key": "k", "response": [TEXT], "error": {"code": 503, "message": "later", "x": [TEXT]}},
    {"key": 5, "response": {"candidates": [TEXT]}},
    {"response": {"candidates": [{"finishReason": "RECITATION", "x": TEXT}, TEXT]}},
]


@pytest.mark.parametrize("small", [1 << 20, 64])
@pytest.mark.parametrize("value", ROWS, ids=[str(r.get("key")) for r in ROWS])
def test_a_row_reads_as_json_loads_of_the_line_would(
    value: dict[str, Any], small: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``SMALL_BYTES`` lowered to 64 every response, candidate and status above is read
    by its fields only: the rules see the same row."""
    monkeypatch.setattr(reading, "SMALL_BYTES", small)
    line = json.dumps(value).encode()
    assert read_row(line) == row_of(json.loads(line))
    found = read_output(line)
    assert found is not None and found.line == line
    assert found.key == (value["key"] if isinstance(value.get("key"), str) else None)


@pytest.mark.parametrize(
    "line",
    [
        b'{"key": "a", "response": {"x": NaN}}',
        b'{"key": "a", "response": {"x": -Infinity}}',
        b'{"key": "a", "response": {"x": "\\ud800"}}',
        b'{"key": "\\udc00", "response": {}}',
        b'{"key": "a", "response": {"x": "\xff"}}',
        b'{"key": "a", "response": {}',
        b'["key", "a"]',
        b"",
        b"   ",
    ],
)
def test_a_line_a_strict_parser_refuses_is_unreadable(line: bytes) -> None:
    assert read_output(line) is None and read_row(line) is None and key_of(line) is None


def test_a_row_is_written_as_its_own_bytes_with_its_attempt() -> None:
    line = b' {"key": "a", "response": {"n": 1e400, "t": "\\u00e9"}}\r\t'
    found = read_output(line)
    assert found is not None
    assert b"".join(final_line(found, 3)) == (
        b'{"key": "a", "response": {"n": 1e400, "t": "\\u00e9"},"attempt":3}\n'
    )
    own = read_output(b'{"key": "a", "attempt": "mine", "response": {}}')
    assert own is not None
    assert b"".join(final_line(own, 2)) == b'{"key":"a","attempt":2,"response":{}}\n'


def test_a_long_row_is_written_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading, "_UTF8_SLICE", 10)
    line = json.dumps({"key": "a", "response": {"t": "y" * 45}}).encode()
    found = read_output(line)
    assert found is not None
    pieces = list(final_line(found, 0))
    assert max(map(len, pieces[:-1])) <= 10 and pieces[-1] == b',"attempt":0}\n'
    assert b"".join(pieces) == line[:-1] + pieces[-1]
    # a large row with an attempt of its own cannot be re-serialised in bounded memory
    monkeypatch.setattr(reading, "SMALL_BYTES", 8)
    own = read_output(b'{"key": "a", "attempt": 1, "response": {}}')
    assert own is not None
    with pytest.raises(ValueError):
        final_line(own, 0)


@pytest.mark.parametrize("slice_bytes", [1 << 20, 4])
def test_utf8_errors_are_found_at_their_byte(
    slice_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reading, "_UTF8_SLICE", slice_bytes)
    text = "aé€😀".encode()
    assert utf8_error(text * 3) is None
    for bad in (b"\xff", b"\xe2\x82", b"\xed\xa0\x80"):
        data = text * 2 + bad + text
        expected = len(text) * 2
        assert utf8_error(data) == expected, bad
    assert utf8_error(b"abc") is None


def test_the_key_index_finds_each_key_and_no_other() -> None:
    keys = [f"key-{i}" for i in range(70_000)]  # more than one sorting run
    index = KeyIndex([*keys, keys[0]])
    assert len(index) == len(keys)
    slots = {index.slot(k) for k in keys}
    assert slots == set(range(len(keys)))
    assert index.slot("key-70000") is None and index.slot("") is None
