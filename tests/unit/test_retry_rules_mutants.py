"""What test_retry_rules.py leaves to chance in opstate.retry.rules, pinned so that ``make
mutate`` kills it (issue 39): the table and rows are values, a code's spaces, a keyless line
before a failure."""

from __future__ import annotations

import dataclasses
import json

import pytest

from opstate.retry.rules import (
    DEFAULT_TABLE,
    Row,
    TransientTable,
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
    lines = [
        b"garbage",
        b'{"error": {"code": 503}}',
        b"",
        b'{"key": "a", "error": {"code": 503}}',
    ]
    assert transient_failures(lines, DEFAULT_TABLE) == {"a": "UNAVAILABLE"}
    assert reason_history(lines, {"a"}, DEFAULT_TABLE) == {"a": {"UNAVAILABLE": 1}}
    other_key = [b'{"key": "b", "error": {"code": 503}}', *lines]
    assert reason_history(other_key, {"a"}, DEFAULT_TABLE) == {"a": {"UNAVAILABLE": 1}}
