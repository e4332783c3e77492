"""One JSON rule for every input path, strict JSON on every output
(``opstate.domain.strict_json``)."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opstate.api import ApiError, create_app, parse_json
from opstate.api import request as api_request
from opstate.config import Settings
from opstate.domain import strict_json
from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.domain.strict_json import InvalidJSONError, dumps, loads
from opstate.signatures import StaticSecretsVerifier
from opstate.store.sqlite import SQLiteStore
from tests.support.webhooks import TEST_SECRET, operation_event


def strict_parse(text: str) -> Any:
    """What a strict parser (JavaScript's JSON.parse, Go's encoding/json, ...) accepts."""

    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in output")

    return json.loads(text, parse_constant=refuse)


NOT_JSON: list[bytes] = [
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b'{"details": {"x": NaN}}',
    b'{"details": {"x": [1, Infinity]}}',
    b'{"x": -Infinity}',
    b'{"x": 1e400}',  # overflows to a float infinity
    b"[-1e999]",
    b"[" * 100_000,  # the parser's recursion limit: RecursionError in plain json.loads
    b'{"a": "\xff"}',  # not UTF-8
    b"{'a': 1}",
    b"",
    b"{} trailing",
]


@pytest.mark.parametrize("raw", NOT_JSON, ids=lambda raw: raw[:24].decode("latin-1"))
def test_loads_refuses_what_a_strict_parser_refuses(raw: bytes) -> None:
    with pytest.raises(InvalidJSONError) as caught:
        loads(raw)
    assert caught.value.message
    if raw.isascii():
        with pytest.raises(InvalidJSONError):
            loads(raw.decode("ascii"))  # the same text as str (the CLI's --details)


@pytest.mark.parametrize("raw", NOT_JSON, ids=lambda raw: raw[:24].decode("latin-1"))
def test_the_api_uses_the_same_rule(raw: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        parse_json(raw)
    assert (caught.value.status, caught.value.code) == (400, "malformed-json")
    assert api_request.loads is strict_json.loads  # one implementation, not a copy


def test_loads_accepts_json() -> None:
    assert loads(b'{"a": [1, 2.5, -3e2, null, true, "\\u00e9"]}') == {
        "a": [1, 2.5, -300.0, None, True, "é"]
    }
    assert loads('"x"') == "x"
    assert loads("12345678901234567890123") == 12345678901234567890123  # ints stay exact


def test_dumps_never_writes_nan_or_infinity() -> None:
    value = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": {"d": math.nan}, "e": "NaN"}
    for text in (dumps(value), dumps(value, compact=True), dumps(value, indent=2, sort_keys=True)):
        assert strict_parse(text) == {
            "a": None,
            "b": [None, None, 1.5],
            "c": {"d": None},
            "e": "NaN",
        }
    assert dumps({"b": 1, "a": "é"}, compact=True, sort_keys=True) == '{"a":"é","b":1}'


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(json_values)
def test_dumps_then_loads_is_the_identity_on_json_values(value: Any) -> None:
    assert loads(dumps(value)) == value
    assert loads(dumps(value, compact=True).encode()) == value


def test_api_serves_an_old_sqlite_row_holding_nan_as_strict_json(tmp_path: Path) -> None:
    # The previous release's replay stored NaN in details (SQLite keeps json.dumps' "NaN").
    store = SQLiteStore(tmp_path / "old.db")
    try:
        record = OpRecord(
            name="batches/old",
            state=State.RUNNING,
            update_time_ns=1,
            version=1,
            source="report",
        )
        assert store.put_if_absent(record).ok
        # Today's store refuses NaN (opstate.domain.details): write the row as the old release did.
        with sqlite3.connect(tmp_path / "old.db") as conn:
            conn.execute(
                "UPDATE operations SET details = ? WHERE name = ?",
                (json.dumps({"progress": math.nan, "ok": 1}), "batches/old"),
            )
        app = create_app(
            store=store,
            verifier=StaticSecretsVerifier((TEST_SECRET,)),
            settings=Settings(),
        )
        response = app.resolve(operation_event("GET", "batches/old"), None)  # type: ignore[arg-type]
        assert response["statusCode"] == 200
        body = strict_parse(response["body"])
        assert body["details"] == {"progress": None, "ok": 1}
    finally:
        store.close()
