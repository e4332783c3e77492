"""An archive's summary is bounded field by field, and the state written from it is checked
whole (``opstate.outcomes.summary``); what Gemini declares about a file is read strictly
(``gemini.files.sha256_hex``, ``genai_source.checked_file_name``)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.gemini.files import sha256_hex
from opstate.outcomes.genai_source import checked_file_name
from opstate.outcomes.ledger import BatchLedger
from opstate.outcomes.ledger_reading import MAX_BAND_MODELS, MAX_MODEL_CHARS, PRICE_TIER_STARTS
from opstate.outcomes.plan import MAX_CODE_CHARS, MAX_ERROR_CODES, OTHER_CODES, results_view
from opstate.outcomes.sink import StoredObject
from opstate.outcomes.source import BATCH_OUTPUT, VIDEO, Output, Outputs, SourceError
from opstate.outcomes.summary import (
    MAX_COUNT,
    MAX_LOCATION_CHARS,
    MAX_OBJECTS,
    MAX_REASON_CHARS,
    MAX_REASONS,
    MAX_STATE_BYTES,
    TooLargeError,
    bounded_location,
    check_fits,
    summary_of,
    too_many,
)
from opstate.store.port import ArchiveState
from tests.support.event_schemas import problems
from tests.support.outcomes import worst_case


def test_every_field_of_the_summary_is_bounded() -> None:
    _record, state = worst_case()
    summary = state.summary
    assert len(summary["errors"]) == MAX_ERROR_CODES + 1 and OTHER_CODES in summary["errors"]
    assert all(len(code) <= MAX_CODE_CHARS for code in summary["errors"])
    assert set(summary["usage"].values()) == {MAX_COUNT}
    assert summary["requests"] == MAX_COUNT
    videos = summary["videos"]
    assert videos["filteredCount"] == MAX_COUNT
    assert len(videos["filteredReasons"]) == MAX_REASONS
    assert {len(r) for r in videos["filteredReasons"]} == {MAX_REASON_CHARS}
    # Every number fits a DynamoDB number (38 digits) and an int64.
    numbers = [n for n in summary["usage"].values()] + [summary["requests"]]
    bands = summary["usageBands"]
    assert len(bands) == (MAX_BAND_MODELS + 2) * (len(PRICE_TIER_STARTS) + 1)
    assert all(len(b["model"] or "") <= MAX_MODEL_CHARS for b in bands)
    numbers += [b["rows"] for b in bands] + [n for b in bands for n in b["usage"].values()]
    assert all(0 <= n <= 2**63 - 1 for n in numbers)


def test_the_largest_state_the_bounds_allow_fits_well_under_the_check() -> None:
    _record, state = worst_case()
    check_fits(state)
    size = len(json.dumps(state.as_dict(), separators=(",", ":")).encode())
    assert size < MAX_STATE_BYTES
    # MAX_STATE_BYTES beside a record with 64 KiB of details is far under DynamoDB's 400 KB.
    assert MAX_STATE_BYTES + 64 * 1024 < 300 * 1024


def test_a_state_past_the_bound_is_refused() -> None:
    _record, state = worst_case()
    big = ArchiveState.from_dict(
        {**state.as_dict(), "summary": {**state.summary, "extra": "x" * MAX_STATE_BYTES}}
    )
    with pytest.raises(TooLargeError, match=str(MAX_STATE_BYTES)):
        check_fits(big)


def test_too_many_objects_and_too_long_a_location() -> None:
    many = Outputs(tuple(Output(f"v{i}", VIDEO, file=f"files/v{i}") for i in range(101)))
    why = too_many(many)
    assert why is not None and "101" in why and str(MAX_OBJECTS) in why
    assert too_many(Outputs(many.items[:MAX_OBJECTS])) is None
    assert bounded_location("gs://b/" + "x" * MAX_LOCATION_CHARS) == ""  # never cut short
    assert bounded_location("gs://b/out/") == "gs://b/out/"


def test_gemini_sha256_hash_in_each_form_it_may_take() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    assert sha256_hex(base64.b64encode(digest.encode()).decode()) == digest  # Files API's
    assert sha256_hex(base64.b64encode(bytes.fromhex(digest)).decode()) == digest
    assert sha256_hex(digest.upper()) == digest
    for unknown in (None, "", "not base64!", base64.b64encode(b"short").decode(), "ab" * 31):
        assert sha256_hex(unknown) == "", unknown


@pytest.mark.parametrize(
    "name",
    [
        "files/abc/../../../x",
        "files/abc:download?alt=media#",
        "files/",
        "files/ABC",
        "files/abc/",
        "../x",
        "batches/abc",
        "files/" + "a" * 129,
        "files/abc\n",
    ],
)
def test_only_well_formed_file_names_are_accepted(name: str) -> None:
    with pytest.raises(SourceError, match="not a Gemini file name"):
        checked_file_name(name)


def test_a_well_formed_file_name_is_accepted() -> None:
    assert checked_file_name("files/abc-123") == "files/abc-123"
    assert checked_file_name("files/" + "a" * 128) == "files/" + "a" * 128


def test_a_batch_summary_from_data_in_hand() -> None:
    record = OpRecord("batches/x", State.SUCCEEDED, 1, 2, "poll", {}, created_ns=5)
    ledger = BatchLedger()
    ledger.feed(b'{"response": {"usageMetadata": {"totalTokenCount": 3}}}\n')
    ledger.finish()
    outputs = Outputs((Output("output.jsonl", BATCH_OUTPUT, data=b"..."),), requests=1)
    summary = summary_of(record, outputs, [StoredObject("file:///r/o", 3, "s")], ledger)
    # a response with no candidates carries no answer: blocked, among the succeeded
    assert summary["rows"] == {
        "total": 1,
        "succeeded": 1,
        "blocked": 1,
        "failed": 0,
        "unreadable": 0,
    }
    assert summary["usage"]["totalTokenCount"] == 3 and summary["requests"] == 1
    assert "videos" not in summary


# An archive state as the release before ``blocked`` stored it (its summary's rows have none).
PREVIOUS_RELEASE_STATE = {
    "status": "archived",
    "created_ns": 1780000000000000000,
    "rev": 2,
    "attempts": 0,
    "last_error": "",
    "deadline_ns": 1780172800000000000,
    "due_ns": 0,
    "archived_ns": 1780000300000000000,
    "location": "file:///r/batches/abc/1780000000000000000/summary.json",
    "summary": {
        "kind": "batch",
        "state": "SUCCEEDED",
        "objects": [
            {
                "location": "file:///r/batches/abc/1780000000000000000/output.jsonl",
                "bytes": 123456,
                "sha256": "ab" * 32,
            }
        ],
        "rows": {"total": 130, "succeeded": 120, "failed": 9, "unreadable": 1},
        "errors": {"429": 7, "13": 2},
        "usage": dict.fromkeys(
            (
                "promptTokenCount",
                "candidatesTokenCount",
                "thoughtsTokenCount",
                "cachedContentTokenCount",
                "toolUsePromptTokenCount",
                "totalTokenCount",
            ),
            0,
        ),
        "requests": 130,
    },
}


def test_an_archive_of_the_previous_release_shows_blocked_as_unknown() -> None:
    """Its lines were never looked at for blocked responses: null, not 0; the rest as
    stored, and the state still reads, fits and makes an event its schema takes."""
    from opstate.notify.entries import RESULTS_ARCHIVED_DETAIL_TYPE, results_detail

    state = ArchiveState.from_dict(PREVIOUS_RELEASE_STATE)
    check_fits(state)
    view = results_view("batches/abc", state.as_dict())
    assert view["rows"] == {
        "total": 130,
        "succeeded": 120,
        "blocked": None,
        "failed": 9,
        "unreadable": 1,
    }
    assert list(view["rows"]) == ["total", "succeeded", "blocked", "failed", "unreadable"]
    assert view["errors"] == {"429": 7, "13": 2} and view["requests"] == 130
    record = OpRecord("batches/abc", State.SUCCEEDED, 1, 2, "poll", {}, created_ns=5)
    detail = results_detail(
        record, {"archive": PREVIOUS_RELEASE_STATE}, RESULTS_ARCHIVED_DETAIL_TYPE
    )
    assert detail["rows"]["blocked"] is None
    assert problems(RESULTS_ARCHIVED_DETAIL_TYPE, detail) == []


def test_a_counted_blocked_is_shown_as_counted_and_the_schema_refuses_nonsense() -> None:
    from opstate.notify.entries import RESULTS_ARCHIVED_DETAIL_TYPE, results_detail

    rows = {"total": 3, "succeeded": 3, "blocked": 0, "failed": 0, "unreadable": 0}
    raw = {**PREVIOUS_RELEASE_STATE, "summary": {**PREVIOUS_RELEASE_STATE["summary"], "rows": rows}}
    assert results_view("batches/abc", raw)["rows"] == rows  # 0 stays 0
    record = OpRecord("batches/abc", State.SUCCEEDED, 1, 2, "poll", {}, created_ns=5)
    detail = results_detail(record, {"archive": raw}, RESULTS_ARCHIVED_DETAIL_TYPE)
    assert problems(RESULTS_ARCHIVED_DETAIL_TYPE, detail) == []
    for wrong in (-1, "3", 1.5):
        bad = {**detail, "rows": {**rows, "blocked": wrong}}
        assert problems(RESULTS_ARCHIVED_DETAIL_TYPE, bad) != [], wrong
