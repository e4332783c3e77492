"""What test_retry_rules.py leaves to chance in opstate.retry.rules, pinned so that ``make
mutate`` kills it (issue 39): the table and rows are values, a code's spaces, a keyless line
before a failure, the table's refusals, the line cap's boundaries and line numbers."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from opstate.retry.rules import (
    DEFAULT_TABLE,
    LineTooLongError,
    Row,
    TransientTable,
    is_money_refusal,
    lines,
    read_row,
    reason_history,
    reason_of,
    transient_failures,
)


def test_the_table_and_a_row_are_values() -> None:
    row = read_row(b'{"key":"k","error":{"code":503}}')
    assert row is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.key = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_TABLE.limits = {}  # type: ignore[misc]
    assert row == Row("k", False, False, "503", None, "")
    with pytest.raises(dataclasses.FrozenInstanceError):
        TransientTable({"UNAVAILABLE": None}).limits = {}  # type: ignore[misc]


@pytest.mark.parametrize("code", ["429 ", " 429", " 429 ", "\t8\n"])
def test_a_code_s_spaces_are_left_out(code: str) -> None:
    row = read_row(json.dumps({"key": "k", "error": {"code": code}}).encode())
    assert row is not None and row.code == code.strip()
    assert reason_of(row) == "RESOURCE_EXHAUSTED"


def test_a_keyless_or_unreadable_line_before_a_failure_is_passed_over() -> None:
    rows = [
        b"garbage",
        b'{"error": {"code": 503}}',
        b"",
        b'{"key": "a", "error": {"code": 503}}',
    ]
    assert transient_failures(rows, DEFAULT_TABLE) == {"a": "UNAVAILABLE"}
    assert reason_history(rows, {"a"}, DEFAULT_TABLE) == {"a": {"UNAVAILABLE": 1}}
    other_key = [b'{"key": "b", "error": {"code": 503}}', *rows]
    assert reason_history(other_key, {"a"}, DEFAULT_TABLE) == {"a": {"UNAVAILABLE": 1}}


def test_the_table_s_refusals_say_exactly_what_is_wrong() -> None:
    reasons = "('RESOURCE_EXHAUSTED', 'UNAVAILABLE', 'INTERNAL', 'DEADLINE_EXCEEDED', 'ABORTED')"
    with pytest.raises(
        ValueError, match="^" + re.escape(f"unknown reason 'NOPE': expected one of {reasons}") + "$"
    ):
        TransientTable({"NOPE": 1})
    for bad in (-1, True):
        message = f"INTERNAL: a limit is a whole number >= 0, not {bad!r}"
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            TransientTable({"INTERNAL": bad})  # type: ignore[dict-item]


def test_a_code_that_is_no_number_lets_the_status_decide() -> None:
    # "7-" is no number (a sign is only ever in front): the status text names the reason
    row = read_row(b'{"key":"k","error":{"code":"7-","status":"UNAVAILABLE"}}')
    assert row is not None and reason_of(row) == "UNAVAILABLE"
    row = read_row(b'{"key":"k","error":{"code":"-7","status":"UNAVAILABLE"}}')
    assert row is not None and reason_of(row) is None  # a number outside the table


def test_a_line_at_the_cap_with_its_carriage_return_in_the_next_chunk() -> None:
    assert list(lines([b"abc\r", b"\n"], 3)) == [b"abc"]
    assert list(lines([b"x\nabc\r", b"\nd"], 3)) == [b"x", b"abc", b"d"]


def test_the_number_of_a_last_line_over_the_cap() -> None:
    with pytest.raises(LineTooLongError) as long:
        list(lines([b"a\nbcde"], 3))
    assert long.value.line == 2
    with pytest.raises(LineTooLongError) as long:
        list(lines([b"a\nb\n", b"cdefgh"], 3))
    assert long.value.line == 3


@pytest.mark.parametrize(
    ("row", "money"),
    [
        (Row("k", False, False, "402", None, "anything"), True),
        (Row("k", False, False, "429", None, "Your prepayment credits are depleted."), True),
        (Row("k", False, False, "429", "RESOURCE_EXHAUSTED", "You exceeded your quota"), False),
        (Row("k", False, False, "503", None, "Billing is fine"), False),
        # an answered row is never a refusal, whatever it says
        (Row("k", True, False, None, None, "Your prepayment credits are depleted."), False),
    ],
)
def test_a_money_refusal_is_a_failed_row_whose_refusal_is_money(row: Row, money: bool) -> None:
    assert is_money_refusal(row) is money
