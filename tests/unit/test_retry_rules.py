"""Which rows are retried (opstate.retry.rules): the line splitter, the transient table, the
row reading, the reasons and the selection of a retry's keys."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opstate.retry.rules import (
    DEFAULT_TABLE,
    DEFAULT_TRANSIENT,
    LineTooLongError,
    Row,
    TransientTable,
    is_transient,
    lines,
    parse_table,
    read_row,
    reason_history,
    reason_of,
    select_retry,
    transient_failures,
)


def cut(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def reference(data: bytes, cap: int) -> tuple[list[bytes], list[int]]:
    """The lines a plain split gives (no empty last line after a final newline), and the
    1-based numbers of the ones longer than the cap."""
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    kept, long = [], []
    for number, part in enumerate(parts, 1):
        line = part[:-1] if part.endswith(b"\r") else part
        if len(line) > cap:
            long.append(number)
        else:
            kept.append(line)
    return kept, long


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([b"a", b"bb", b"\n", b"\r\n", b"\r", b"xyzxyz", b"{}"]), max_size=40),
    st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    st.integers(min_value=1, max_value=8),
)
def test_lines_split_like_a_plain_split_whatever_the_cuts(
    pieces: list[bytes], points: list[int], cap: int
) -> None:
    data = b"".join(pieces)
    expected, long = reference(data, cap)
    assert list(lines(cut(data, points), cap, skip_long=True)) == expected
    if long:
        with pytest.raises(LineTooLongError) as caught:
            list(lines(cut(data, points), cap))
        assert caught.value.line == long[0]
    else:
        assert list(lines(cut(data, points), cap)) == expected


def test_lines_never_hold_a_long_line() -> None:
    # a 10 MB line in 1 KB chunks is read past, never joined
    def chunks() -> Any:
        yield b"first\n"
        for _ in range(10_000):
            yield b"x" * 1024
        yield b"\nlast"

    assert list(lines(chunks(), 100, skip_long=True)) == [b"first", b"last"]
    with pytest.raises(LineTooLongError, match="line 2 is longer than 100 bytes"):
        list(lines(chunks(), 100))
    assert list(lines([], 10)) == [] and list(lines([b"", b"\n"], 10)) == [b""]
    assert list(lines([b"ab\r", b"\ncd\r\n"], 2)) == [b"ab", b"cd"]


def test_the_default_table() -> None:
    assert DEFAULT_TABLE.limits == {
        "RESOURCE_EXHAUSTED": None,
        "UNAVAILABLE": None,
        "INTERNAL": 1,
        "DEADLINE_EXCEEDED": 1,
    }
    assert parse_table(DEFAULT_TRANSIENT) == DEFAULT_TABLE
    assert parse_table(DEFAULT_TABLE.text()) == DEFAULT_TABLE
    assert "ABORTED" not in DEFAULT_TABLE and "INTERNAL" in DEFAULT_TABLE
    assert parse_table(" aborted : 2 , unavailable ").limits == {"ABORTED": 2, "UNAVAILABLE": None}
    assert parse_table("").limits == {}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("UNAVAILABLE,CANCELLED", "'CANCELLED'"),
        ("INTERNAL:x", "'x'"),
        ("INTERNAL:-1", "'-1'"),
        ("INTERNAL:", "''"),
        ("INTERNAL:11", "between 0 and 10"),
        ("UNAVAILABLE,,INTERNAL", "unknown transient reason ''"),
        ("INTERNAL:1,internal", "named twice"),
    ],
)
def test_a_bad_table_names_its_entry(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_table(text)


def test_a_table_refuses_unknown_reasons_and_negative_limits() -> None:
    with pytest.raises(ValueError, match="unknown reason"):
        TransientTable({"NOT_FOUND": None})
    with pytest.raises(ValueError, match=">= 0"):
        TransientTable({"INTERNAL": -1})


def failed(
    code: object, message: str = "", status: str | None = None, field: str = "error"
) -> bytes:
    body: dict[str, Any] = {"code": code, "message": message}
    if status is not None:
        body["status"] = status
    return json.dumps({"key": "k", field: body}).encode()


def test_read_row_reads_both_shapes() -> None:
    answered = json.dumps({"key": "a", "response": {"candidates": [{"content": {}}]}}).encode()
    assert read_row(answered) == Row("a", True, False, None, None, "")
    blocked = json.dumps({"key": "b", "response": {"promptFeedback": {"blockReason": "SAFETY"}}})
    assert read_row(blocked.encode()) == Row("b", True, True, None, None, "")
    assert read_row(failed(429, "slow down", "RESOURCE_EXHAUSTED")) == Row(
        "k", False, False, "429", "RESOURCE_EXHAUSTED", "slow down"
    )
    assert read_row(failed(14, field="status")) == Row("k", False, False, "14", None, "")
    # the ledger's order: "status" before "error"
    both = b'{"key":"k","status":{"code":503},"error":{"code":400}}'
    assert read_row(both) == Row("k", False, False, "503", None, "")
    assert read_row(b'{"key":"k","error":{"code":true,"message":5}}') == Row(
        "k", False, False, None, None, ""
    )
    assert read_row(b'{"key": 3, "other": 1}') == Row(None, False, False, None, None, "")
    for nothing in (b"", b"  ", b"[1]", b"not json", b"\xff\xfe", b'"text"'):
        assert read_row(nothing) is None


@pytest.mark.parametrize(
    ("code", "status", "reason"),
    [
        (429, None, "RESOURCE_EXHAUSTED"),
        (8, None, "RESOURCE_EXHAUSTED"),
        (503, None, "UNAVAILABLE"),
        ("14", None, "UNAVAILABLE"),
        (500, None, "INTERNAL"),
        (13, None, "INTERNAL"),
        (504, None, "DEADLINE_EXCEEDED"),
        (4, None, "DEADLINE_EXCEEDED"),
        (409, None, "ABORTED"),
        (10, None, "ABORTED"),
        (None, "UNAVAILABLE", "UNAVAILABLE"),
        ("UNAVAILABLE", None, "UNAVAILABLE"),
        (400, "UNAVAILABLE", None),  # a known permanent code: the status text does not count
        (400, None, None),
        (3, None, None),
        (403, None, None),
        (404, None, None),
        (9, None, None),
        (None, None, None),
        (None, "NOT_FOUND", None),
    ],
)
def test_reason_of(code: object, status: str | None, reason: str | None) -> None:
    row = read_row(failed(code, status=status))
    assert row is not None and reason_of(row) == reason


def test_money_refusals_are_permanent_and_rate_limits_are_retried() -> None:
    # issue 39: a money refusal is refused again; a quota or rate limit passes (the bodies
    # these words come from: tests/fixtures/gemini_errors, tests/unit/test_gemini_errors.py)
    for message in (
        "Your prepayment credits are depleted.",
        "spending cap reached",
        "Project x has BILLING disabled",
    ):
        row = read_row(failed(429, message))
        assert row is not None and reason_of(row) == "RESOURCE_EXHAUSTED"
        assert is_transient(row, DEFAULT_TABLE) is None
    for message in (
        "Quota exceeded for metric",
        "Resource has been exhausted, try again",
        "Resource has been exhausted (e.g. check quota).",
        "You exceeded your current quota, please check your plan and billing details.",
    ):
        row = read_row(failed(429, message))
        assert row is not None and is_transient(row, DEFAULT_TABLE) == "RESOURCE_EXHAUSTED"
    # money words on another reason change nothing: a 503 is retried as a 503
    row = read_row(failed(503, "Your prepayment credits are depleted."))
    assert row is not None and is_transient(row, DEFAULT_TABLE) == "UNAVAILABLE"
    aborted = read_row(failed(409))
    assert aborted is not None and is_transient(aborted, DEFAULT_TABLE) is None
    assert is_transient(aborted, parse_table("ABORTED")) == "ABORTED"
    answered = read_row(b'{"key":"k","response":{}}')
    assert answered is not None and is_transient(answered, DEFAULT_TABLE) is None


def line(key: str, code: int | None, message: str = "") -> bytes:
    if code is None:
        return json.dumps({"key": key, "response": {"candidates": [{}]}}).encode()
    return json.dumps({"key": key, "error": {"code": code, "message": message}}).encode()


def test_transient_failures_keep_the_last_line_of_a_key() -> None:
    output = [
        line("a", 503),
        line("b", 400),
        line("c", 429, "Your prepayment credits are depleted."),
        line("d", 500),
        line("e", 503),
        line("e", None),  # answered later: not a failure any more
        line("f", 400),
        line("f", 504),  # failed permanently, then transiently: the later wins
        b"",
        b"garbage",
        b'{"error": {"code": 503}}',  # no key: nothing to retry
    ]
    assert transient_failures(output, DEFAULT_TABLE) == {
        "a": "UNAVAILABLE",
        "d": "INTERNAL",
        "f": "DEADLINE_EXCEEDED",
    }


def test_reason_history_counts_transient_failures_of_the_keys_asked() -> None:
    attempts = [
        [line("a", 500), line("b", 503), line("c", 400)],
        [line("a", 503), line("b", 503)],
        [line("a", 500), line("b", 429, "billing")],
    ]
    history = reason_history((x for a in attempts for x in a), {"a", "c"}, DEFAULT_TABLE)
    assert history == {"a": Counter({"INTERNAL": 2, "UNAVAILABLE": 1})}


def test_select_retry_follows_the_limits_and_the_attempts() -> None:
    candidates = {"a": "INTERNAL", "b": "INTERNAL", "c": "UNAVAILABLE", "d": "ABORTED"}
    history = {
        "a": Counter({"INTERNAL": 1}),  # its first INTERNAL: one retry allowed
        "b": Counter({"INTERNAL": 2, "UNAVAILABLE": 1}),  # its second: no more
        "c": Counter({"UNAVAILABLE": 7}),  # no limit of its own
    }
    assert select_retry(candidates, history, DEFAULT_TABLE, 1, 3) == {"a", "c"}
    assert select_retry(candidates, history, DEFAULT_TABLE, 3, 3) == {"a", "c"}
    assert select_retry(candidates, history, DEFAULT_TABLE, 4, 3) == set()
    assert select_retry(candidates, history, DEFAULT_TABLE, 1, 0) == set()
    # a key without history: its current failure counts
    assert select_retry({"x": "INTERNAL"}, {}, DEFAULT_TABLE, 1, 2) == {"x"}
    assert select_retry({"x": "INTERNAL"}, {}, parse_table("INTERNAL:0"), 1, 2) == set()
    assert select_retry(candidates, history, parse_table("ABORTED:1"), 1, 2) == {"d"}
