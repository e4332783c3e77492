"""The one place that knows what a store can hold in a record's details."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opstate.domain.details import (
    MAX_DEPTH,
    MAX_DETAILS_BYTES,
    InvalidDetailsError,
    Problem,
    check,
    fit,
    number_problem,
    sanitize,
    size,
)


@pytest.mark.parametrize(
    "value",
    [
        0,
        -0.0,
        1,
        -1,
        10**38,
        int("9" * 38),
        -int("9" * 38),
        9.99e125,
        -9.99e125,
        1e-130,
        -1e-130,
        0.1,
        1.5e-7,
        Decimal("1.0000000000000000000000000000000000000E+125"),
        Decimal("0.00000"),
        12345678901234567890123456789012345678 * 10**80,
    ],
)
def test_numbers_a_store_can_hold(value: Any) -> None:
    assert number_problem(value) is None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (1e300, "magnitude outside 1e-130 .. 9.99e125"),
        (-1e300, "magnitude outside 1e-130 .. 9.99e125"),
        (1e-200, "magnitude outside 1e-130 .. 9.99e125"),
        (1e126, "magnitude outside 1e-130 .. 9.99e125"),
        (1e-131, "magnitude outside 1e-130 .. 9.99e125"),
        (10**126, "magnitude outside 1e-130 .. 9.99e125"),
        pytest.param(10**5000, "magnitude outside 1e-130 .. 9.99e125", id="10**5000"),
        (int("1" * 39), "more than 38 significant digits"),
        (Decimal("1." + "1" * 38), "more than 38 significant digits"),
        (float("inf"), "not a finite number"),
        (float("nan"), "not a finite number"),
        (Decimal("NaN"), "not a finite number"),
    ],
)
def test_numbers_no_store_can_hold(value: Any, why: str) -> None:
    assert number_problem(value) == why
    with pytest.raises(InvalidDetailsError, match=f"\\$.n: {why}"):
        check({"n": value})


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def test_nesting_stops_below_dynamodbs_32_levels() -> None:
    assert check({"a": nested(MAX_DEPTH)}) == {"a": nested(MAX_DEPTH)}
    with pytest.raises(InvalidDetailsError, match="nested deeper than 30 levels"):
        check({"a": nested(MAX_DEPTH + 1)})
    deep = json.loads("[" * 160 + "]" * 160)
    cleaned, problems = sanitize({"a": deep, "b": 1})
    assert cleaned["b"] == 1 and problems
    check(cleaned)


@pytest.mark.parametrize(
    ("details", "why"),
    [
        ({"": 1}, "$.: empty key"),
        ({"a": {"": 1}}, "$.a.: empty key"),
        ({"a\ud800": 1}, "lone surrogate in key"),
        ({"a": "x\udfff"}, "$.a: lone surrogate in text"),
        ({"a": ["ok", "\ud83d"]}, "$.a[1]: lone surrogate in text"),
        ({"a": {1: 2}}, "$.a.1: key is not a string"),
        ({"a": object()}, "$.a: not a JSON value (object)"),
        ({"a": "x" * MAX_DETAILS_BYTES}, "more than 65536"),
    ],
)
def test_check_refuses_with_a_path_and_a_reason(details: dict[str, Any], why: str) -> None:
    with pytest.raises(InvalidDetailsError) as info:
        check(details)
    assert why in str(info.value)
    assert str(info.value).startswith("invalid details: ")


def test_sanitize_normalises_and_says_what_it_changed() -> None:
    cleaned, problems = sanitize(
        {
            "big": 1e300,
            "": 1,
            "text": "a\ud800b",
            "huge": 10**5000,
            "keep": {"x": [1, 2.5]},
            "tuple": (1, 2),
        }
    )
    assert cleaned == {
        "big": "1e+300",
        "text": "a\ufffdb",
        "huge": "integer of 16610 bits",
        "keep": {"x": [1, 2.5]},
        "tuple": [1, 2],
    }
    assert [str(p) for p in problems] == [
        "$.big: magnitude outside 1e-130 .. 9.99e125",
        "$.: empty key",
        "$.text: lone surrogate in text",
        "$.huge: magnitude outside 1e-130 .. 9.99e125",
    ]
    assert check(cleaned) == cleaned


def test_fit_drops_carried_keys_before_kept_ones_largest_first() -> None:
    details = {"a": "x" * 40_000, "b": "y" * 30_000, "c": "z" * 20_000, "d": 1}
    fitted, dropped = fit(details, keep={"a"})
    assert dropped == ("b",) and set(fitted) == {"a", "c", "d"}
    assert size(fitted) <= MAX_DETAILS_BYTES
    fitted, dropped = fit({"a": "x" * 70_000, "b": 1}, keep={"a", "b"})
    assert dropped == ("a",) and fitted == {"b": 1}
    assert fit({"a": 1}) == ({"a": 1}, ())


def test_size_is_compact_utf8_json() -> None:
    assert size({}) == 2
    assert size({"é": "ü"}) == len('{"é":"ü"}'.encode())
    assert str(Problem("$.a", "why")) == "$.a: why"


def test_an_error_lists_three_problems_and_counts_the_rest() -> None:
    with pytest.raises(InvalidDetailsError) as info:
        check({"a": 1e300, "b": 1e300, "c": 1e300, "d": 1e300, "e": 1e300})
    assert str(info.value).endswith("(and 2 more)")
    assert len(info.value.problems) == 5


any_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**60), 10**60)
    | st.floats()
    | st.text(alphabet=st.characters(codec=None), max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.text(alphabet=st.characters(codec=None), max_size=3), inner, max_size=3
        )
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(alphabet=st.characters(codec=None), max_size=4), any_values))
def test_sanitized_details_always_pass_the_strict_check(details: dict[str, Any]) -> None:
    cleaned, problems = sanitize(details)
    assert check(cleaned) == cleaned
    assert sanitize(cleaned) == (cleaned, ())
    if not problems:
        assert cleaned == details or json.dumps(cleaned) == json.dumps(details)
    json.dumps(cleaned, ensure_ascii=False).encode("utf-8")  # always encodable


@settings(max_examples=200, deadline=None)
@given(
    details=st.dictionaries(
        st.text(min_size=1, max_size=8), st.text(max_size=60), min_size=1, max_size=12
    ),
    limit=st.integers(2, 400),
)
def test_fit_drops_no_more_than_it_must(details: dict[str, Any], limit: int) -> None:
    """Within the limit, and putting back the last key it dropped would break it: the size
    bookkeeping is exact, not an estimate on either side."""
    fitted, dropped = fit(details, limit=limit)
    assert size(fitted) <= limit
    assert set(fitted) | set(dropped) == set(details) and not set(fitted) & set(dropped)
    if dropped:
        last = dropped[-1]
        assert size({**fitted, last: details[last]}) > limit


def test_check_admits_exactly_64_kib_and_refuses_one_byte_more() -> None:
    """The cap is 64 KiB of compact JSON, inclusive (docs/model.md)."""
    cap = 64 * 1024
    overhead = size({"k": ""})
    at_cap = {"k": "x" * (cap - overhead)}
    assert size(at_cap) == cap and check(at_cap) == at_cap
    with pytest.raises(InvalidDetailsError, match=f"{cap + 1} bytes as JSON"):
        check({"k": "x" * (cap - overhead + 1)})
