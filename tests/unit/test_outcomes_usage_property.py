"""No row can block an archive or a final result (issue 47): arbitrary values in every usage
field (the six counts, the four per-modality lists and their items) are read by both ledger
ways without an exception, every row is counted (succeeded or unreadable), the summary is
priced or unknown with a reason, and the final result of the lineage is written whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opstate.outcomes.ledger import BatchLedger
from opstate.outcomes.ledger_reading import DETAIL_FIELDS, USAGE_FIELDS
from opstate.outcomes.price import bands_of, cost_of
from opstate.retry.final import Member, write_final

CAP = 1024 * 1024
WHEN_NS = 1_796_000_000 * 10**9

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["\u00b2", "9" * 5000, "12", "\u0663", " 1", "-0", "TEXT", "IMAGE"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["modality", "tokenCount", "x"]), inner, max_size=3)
    ),
    max_leaves=6,
)
modality_item = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "modality": st.one_of(
                st.sampled_from(["TEXT", "IMAGE", "AUDIO", "VIDEO"]), json_values
            ),
            "tokenCount": json_values,
        },
    ),
)
usage = st.fixed_dictionaries(
    {},
    optional={
        **{name: json_values for name in USAGE_FIELDS},
        **{
            name: st.one_of(json_values, st.lists(modality_item, max_size=3))
            for name in DETAIL_FIELDS
        },
    },
)


def stream(data: bytes) -> Iterator[bytes]:
    yield data


@settings(max_examples=200, deadline=None)
@given(st.lists(usage, min_size=1, max_size=6))
@pytest.mark.parametrize("use_msgspec", [True, False], ids=["msgspec", "stdlib"])
def test_any_usage_values_still_archive_and_the_final_result_is_written(
    use_msgspec: bool, usages: list[dict[str, Any]]
) -> None:
    rows = [
        {
            "key": f"k{i}",
            "response": {
                "candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "STOP"}],
                "modelVersion": "gemini-2.5-flash",
                "usageMetadata": meta,
            },
        }
        for i, meta in enumerate(usages)
    ]
    output = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    ledger = BatchLedger(use_msgspec=use_msgspec)
    ledger.feed(output)
    ledger.finish()
    counted = ledger.rows
    assert counted.total == len(rows)
    assert counted.succeeded + counted.unreadable == len(rows)
    summary = {"rows": counted.as_dict(), "usageBands": bands_of(ledger.bands)}
    json.dumps(summary)  # storable as it is
    cost = cost_of(summary, None, WHEN_NS, WHEN_NS)
    if cost["usd"] is None:
        assert cost["reason"]
    else:
        assert Decimal(cost["usd"]) >= 0
    inputs = b"".join(
        json.dumps({"key": f"k{i}", "request": {"contents": []}}).encode() + b"\n"
        for i in range(len(rows))
    )
    written: list[bytes] = []
    final = write_final(
        [Member(0, "batches/r", lambda: stream(output))],
        lambda: stream(inputs),
        written.append,
        CAP,
    )
    assert b"".join(written).count(b"\n") == len(rows)
    assert final.as_dict()["rows"]["total"] == len(rows)
