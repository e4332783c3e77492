"""The ledger (pure): counts computed while streaming equal counts computed line by line, for
any output and any way of cutting it into chunks."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opstate.outcomes.ledger import BatchLedger, VideoLedger
from opstate.outcomes.ledger_reading import USAGE_FIELDS, inlined_lines
from tests.support.outcomes import chunked

counts = st.integers(min_value=0, max_value=10**9)
usage = st.dictionaries(st.sampled_from(USAGE_FIELDS), counts, max_size=6)
codes = st.one_of(st.integers(min_value=0, max_value=16), st.none())
# A response's candidates, each by its finishReason (None: the candidate has none), and whether
# the row is blocked: no candidate, or every one blocked (SAFETY, RECITATION, ...).
finishes = st.lists(
    st.sampled_from(["STOP", "MAX_TOKENS", "SAFETY", "RECITATION", None]), max_size=2
)
ok_row = st.builds(
    lambda key, u, f: {
        "key": key,
        "response": {
            "candidates": [{} if r is None else {"finishReason": r} for r in f],
            "usageMetadata": u,
        },
    },
    st.text(max_size=8),
    usage,
    finishes,
)
failed_row = st.builds(
    lambda key, which, code: {
        "key": key,
        which: {"message": "boom\nwith a newline", **({} if code is None else {"code": code})},
    },
    st.text(max_size=8),
    st.sampled_from(["status", "error"]),
    codes,
)
garbage = st.sampled_from([b"not json", b"[1, 2]", b'{"key": "x"}', b"\xff\xfe", b'"text"', b"{"])
rows = st.lists(
    st.one_of(
        ok_row.map(lambda r: ("ok", r, json.dumps(r).encode())),
        failed_row.map(lambda r: ("failed", r, json.dumps(r, ensure_ascii=False).encode())),
        garbage.map(lambda b: ("unreadable", None, b)),
        st.just(("blank", None, b"   ")),
    ),
    max_size=30,
)


def reference(lines: list[tuple[str, Any, bytes]]) -> dict[str, Any]:
    """The counts by a straightforward second reading: one line at a time, whole."""
    out: dict[str, Any] = {
        "rows": {"total": 0, "succeeded": 0, "blocked": 0, "failed": 0, "unreadable": 0},
        "errors": {},
        "usage": dict.fromkeys(USAGE_FIELDS, 0),
    }
    for what, row, _raw in lines:
        if what == "blank":
            continue
        out["rows"]["total"] += 1
        if what == "ok":
            out["rows"]["succeeded"] += 1
            reasons = [c.get("finishReason") for c in row["response"]["candidates"]]
            if all(r in ("SAFETY", "RECITATION") for r in reasons):  # all([]) too
                out["rows"]["blocked"] += 1
            for key, value in row["response"]["usageMetadata"].items():
                out["usage"][key] += value
        elif what == "failed":
            out["rows"]["failed"] += 1
            status = row.get("status") or row.get("error")
            code = str(status["code"]) if "code" in status else "unknown"
            out["errors"][code] = out["errors"].get(code, 0) + 1
        else:
            out["rows"]["unreadable"] += 1
    return out


@settings(max_examples=300, deadline=None)
@given(rows, st.lists(st.integers(min_value=0), max_size=20), st.booleans(), st.booleans())
def test_streaming_counts_equal_a_line_by_line_reading(lines, cuts, crlf, trailing_newline):
    sep = b"\r\n" if crlf else b"\n"
    data = sep.join(raw for _what, _row, raw in lines)
    if trailing_newline and data:
        data += sep
    ledger = BatchLedger()
    for piece in chunked(data, cuts):
        ledger.feed(piece)
    ledger.finish()
    expected = reference(lines)
    assert ledger.rows.as_dict() == expected["rows"]
    assert ledger.errors == expected["errors"]
    assert ledger.usage == expected["usage"]
    assert ledger.size == len(data)
    assert ledger.sha256 == hashlib.sha256(data).hexdigest()
    total = ledger.rows
    assert total.total == total.succeeded + total.failed + total.unreadable
    assert 0 <= total.blocked <= total.succeeded
    assert sum(ledger.errors.values()) == total.failed


@given(st.binary(max_size=5000), st.lists(st.integers(min_value=0), max_size=10))
def test_video_ledger_hashes_what_it_was_fed(data, cuts):
    ledger = VideoLedger()
    for piece in chunked(data, cuts):
        ledger.write(piece)
    assert (ledger.size, ledger.sha256) == (len(data), hashlib.sha256(data).hexdigest())


def test_a_line_cut_inside_a_utf8_sequence_still_counts():
    row = json.dumps(
        {"key": "é", "response": {"usageMetadata": {"totalTokenCount": 7}}}, ensure_ascii=False
    ).encode()
    cut = row.index("é".encode()) + 1
    ledger = BatchLedger()
    ledger.feed(row[:cut])
    ledger.feed(row[cut:] + b"\n")
    ledger.finish()
    assert ledger.rows.succeeded == 1 and ledger.usage["totalTokenCount"] == 7


@pytest.mark.parametrize("use_msgspec", [True, False], ids=["msgspec", "stdlib"])
def test_token_counts_as_text_count_and_a_row_with_nonsense_is_unreadable(
    use_msgspec: bool,
) -> None:
    """Issue 47: a count is an int of 0..2**63-1 or ASCII digits for one; any other value makes
    its row unreadable. ``"²"`` passes ``str.isdigit`` and fails ``int``, and 5,000 digits
    fail ``int`` past Python's limit: on 0.6.0 both raised out of the ledger, and the archive
    failed on every attempt."""
    ok = b'{"response": {"usageMetadata": {"promptTokenCount": "12", "totalTokenCount": 9}}}'
    bad = [
        b'{"response": {"usageMetadata": {"promptTokenCount": "\\u00b2"}}}',
        '{"response": {"usageMetadata": {"promptTokenCount": "²"}}}'.encode(),
        b'{"response": {"usageMetadata": {"promptTokenCount": "' + b"9" * 5000 + b'"}}}',
        b'{"response": {"usageMetadata": {"promptTokenCount": "9223372036854775808"}}}',
        b'{"response": {"usageMetadata": {"promptTokenCount": 9223372036854775808}}}',
        b'{"response": {"usageMetadata": {"promptTokenCount": "\\u0661"}}}',  # Arabic-Indic 1
        b'{"response": {"usageMetadata": {"promptTokenCount": " 1"}}}',
        b'{"response": {"usageMetadata": {"totalTokenCount": true}}}',
        b'{"response": {"usageMetadata": {"candidatesTokenCount": -3}}}',
        b'{"response": {"usageMetadata": {"thoughtsTokenCount": 2.0}}}',
        b'{"response": {"usageMetadata": {"promptTokensDetails": {"modality": "TEXT"}}}}',
        b'{"response": {"usageMetadata": {"promptTokensDetails": [{"tokenCount": "x"}]}}}',
    ]
    ledger = BatchLedger(use_msgspec=use_msgspec)
    ledger.feed(b"\n".join([ok, *bad]) + b"\n")
    ledger.finish()
    assert ledger.rows.as_dict() == {
        "total": 1 + len(bad),
        "succeeded": 1,
        "blocked": 1,
        "failed": 0,
        "unreadable": len(bad),
    }
    assert ledger.usage["promptTokenCount"] == 12
    assert ledger.usage["totalTokenCount"] == 9
    assert ledger.usage["candidatesTokenCount"] == 0


def test_a_finished_ledger_refuses_more_bytes():
    ledger = BatchLedger().finish()
    try:
        ledger.feed(b"x")
    except ValueError:
        return
    raise AssertionError("a finished ledger accepted bytes")


@given(st.lists(st.one_of(ok_row, failed_row), max_size=10))
def test_inlined_responses_become_the_lines_a_file_would_hold(items):
    inlined = []
    for i, row in enumerate(items):
        item = {k: v for k, v in row.items() if k != "key"}
        item["metadata"] = {"key": f"k{i}"}
        inlined.append(item)
    lines = inlined_lines(inlined)
    assert [json.loads(line)["key"] for line in lines] == [f"k{i}" for i in range(len(items))]
    ledger = BatchLedger()
    ledger.feed(b"\n".join(lines))
    ledger.finish()
    assert ledger.rows.total == len(items)
    assert ledger.rows.succeeded == sum(1 for r in items if "response" in r)


BLOCKED_EXAMPLES = [
    # (response, blocked): the rule, one case each
    ({"candidates": [{"finishReason": "STOP", "content": {"parts": [{"text": "hi"}]}}]}, False),
    ({"candidates": [{"finishReason": "MAX_TOKENS"}]}, False),
    ({"candidates": [{}]}, False),
    ({"candidates": [{"finishReason": "SAFETY"}]}, True),
    ({"candidates": [{"finishReason": "PROHIBITED_CONTENT"}]}, True),
    ({"candidates": [{"finishReason": "BLOCKLIST"}]}, True),
    ({"candidates": [{"finishReason": "SPII"}]}, True),
    ({"candidates": [{"finishReason": "RECITATION"}]}, True),
    ({"candidates": [{"finishReason": "SAFETY"}, {"finishReason": "STOP"}]}, False),
    ({"candidates": [{"finishReason": "SAFETY"}, {"finishReason": "SPII"}]}, True),
    ({"candidates": []}, True),
    ({"candidates": None}, True),
    ({}, True),
    ({"promptFeedback": {"blockReason": "SAFETY"}}, True),
    ({"promptFeedback": {"blockReason": "OTHER"}, "candidates": [{"finishReason": "STOP"}]}, True),
    ({"promptFeedback": {}, "candidates": [{"finishReason": "STOP"}]}, False),
    # Wrong types say nothing: not blocked, never a crash, the row still succeeded.
    ({"promptFeedback": {"blockReason": 2}, "candidates": [{"finishReason": "STOP"}]}, False),
    ({"promptFeedback": {"blockReason": ""}, "candidates": [{"finishReason": "STOP"}]}, False),
    ({"promptFeedback": "SAFETY", "candidates": [{"finishReason": "STOP"}]}, False),
    ({"candidates": "SAFETY"}, False),
    ({"candidates": {"finishReason": "SAFETY"}}, False),
    ({"candidates": 0}, False),
    ({"candidates": [None]}, False),
    ({"candidates": ["SAFETY"]}, False),
    ({"candidates": [{"finishReason": 3}]}, False),
    ({"candidates": [{"finishReason": ["SAFETY"]}]}, False),
    ({"candidates": [{"finishReason": {"SAFETY": True}}]}, False),
    ({"candidates": [{"finishReason": "safety"}]}, False),
]


@pytest.mark.parametrize("use_msgspec", [True, False], ids=["msgspec", "stdlib"])
def test_a_response_without_an_answer_is_blocked_and_still_succeeded(use_msgspec):
    data = b"".join(
        json.dumps({"key": f"k{i}", "response": r}).encode() + b"\n"
        for i, (r, _) in enumerate(BLOCKED_EXAMPLES)
    )
    data += b'{"key": "f", "status": {"code": 13, "message": "internal"}}\n'
    for i, (response, blocked) in enumerate(BLOCKED_EXAMPLES):
        one = BatchLedger(use_msgspec=use_msgspec)
        one.feed(json.dumps({"key": "k", "response": response}).encode())
        one.finish()
        assert (one.rows.succeeded, one.rows.blocked) == (1, int(blocked)), (i, response)
    ledger = BatchLedger(use_msgspec=use_msgspec)
    ledger.feed(data)
    ledger.finish()
    n = len(BLOCKED_EXAMPLES)
    assert ledger.rows.as_dict() == {
        "total": n + 1,
        "succeeded": n,
        "blocked": sum(b for _, b in BLOCKED_EXAMPLES),
        "failed": 1,
        "unreadable": 0,
    }
