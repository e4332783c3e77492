"""Times are bounded in the domain: nothing unrenderable is ever stored, and what the previous
release stored (not-found markers up to 1 ns each above a reported time) still renders."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opstate.api import create_app
from opstate.config import Settings
from opstate.domain.events import Source
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.states import State
from opstate.domain.times import MAX_EVENT_NS, MAX_NS, InvalidTimeError, format_time
from opstate.domain.views import record_to_json
from opstate.signatures import StaticSecretsVerifier
from opstate.store import MemoryStore
from tests.support.webhooks import TEST_SECRET, operation_event


@pytest.mark.parametrize("ns", [-1, MAX_NS + 1, True])
def test_an_event_outside_the_renderable_range_cannot_exist(ns: int) -> None:
    with pytest.raises(InvalidTimeError):
        OpEvent("batches/x", State.RUNNING, ns, Source.POLL)


def test_the_latest_report_time_still_leaves_room_for_markers() -> None:
    """The issue: updateTime 9999-12-31T23:59:59.999999999Z followed by a not-found marker
    stored max + 1 ns and every GET answered 500. Today's reconciler writes no markers, but a
    record the previous release advanced by markers past the latest reportable time renders."""
    store = MemoryStore()
    app = create_app(
        store=store,
        verifier=StaticSecretsVerifier([TEST_SECRET]),
        settings=Settings(),
        # The receiver's clock at the end of time: since issue 24 a report may be at most
        # max_future_skew_s ahead of it.
        clock_ns=lambda: MAX_EVENT_NS,
    )
    body = b'{"state": "RUNNING", "updateTime": "9999-12-31T23:59:59.999999999Z"}'
    answer = app.resolve(operation_event("PUT", "batches/late", body), None)
    assert answer["statusCode"] == 400 and "reserved" in answer["body"]

    body = b'{"state": "RUNNING", "updateTime": "9999-12-31T23:59:58.999999999Z"}'
    assert app.resolve(operation_event("PUT", "batches/late", body), None)["statusCode"] == 200
    record = store.get("batches/late")
    assert record is not None and record.update_time_ns == MAX_EVENT_NS
    # Three 404 polls under the previous release: three markers, +1 ns each.
    record = store.get("batches/late")
    assert record is not None
    written = store.replace_if_version(
        replace(record, update_time_ns=MAX_EVENT_NS + 3, version=record.version + 1),
        record.version,
    )
    assert written.ok
    answer = app.resolve(operation_event("GET", "batches/late"), None)
    assert answer["statusCode"] == 200
    assert '"updateTime":"9999-12-31T23:59:59.000000002Z"' in answer["body"]


def test_a_marker_at_the_very_end_is_refused_not_stored() -> None:
    at_end = OpRecord("batches/end", State.RUNNING, MAX_NS, 3, "poll")
    with pytest.raises(InvalidTimeError):
        OpEvent(at_end.name, State.RUNNING, at_end.update_time_ns + 1, Source.POLL)
    assert record_to_json(at_end)["updateTime"] == format_time(MAX_NS)
