"""Times and not-found markers are bounded in the domain: nothing unrenderable is ever stored."""

from __future__ import annotations

import pytest

from opstate.api import create_app
from opstate.config import Settings
from opstate.events import OpEvent, Source
from opstate.ingest import ingest
from opstate.reconcile import not_found_event
from opstate.reducer import OpRecord
from opstate.signatures import StaticSecretsVerifier
from opstate.states import State
from opstate.store import MemoryStore
from opstate.times import MAX_EVENT_NS, MAX_NS, InvalidTimeError, format_time
from opstate.views import record_to_json
from tests.support.webhooks import TEST_SECRET, operation_event


@pytest.mark.parametrize("ns", [-1, MAX_NS + 1, True])
def test_an_event_outside_the_renderable_range_cannot_exist(ns: int) -> None:
    with pytest.raises(InvalidTimeError):
        OpEvent("batches/x", State.RUNNING, ns, Source.POLL)


def test_the_latest_report_time_still_leaves_room_for_markers() -> None:
    """The issue: updateTime 9999-12-31T23:59:59.999999999Z followed by a not-found marker
    stored max + 1 ns and every GET answered 500."""
    store = MemoryStore()
    app = create_app(
        store=store,
        verifier=StaticSecretsVerifier([TEST_SECRET]),
        settings=Settings(),
        clock_ns=lambda: 1,
    )
    body = b'{"state": "RUNNING", "updateTime": "9999-12-31T23:59:59.999999999Z"}'
    answer = app.resolve(operation_event("PUT", "batches/late", body), None)
    assert answer["statusCode"] == 400 and "reserved" in answer["body"]

    body = b'{"state": "RUNNING", "updateTime": "9999-12-31T23:59:58.999999999Z"}'
    assert app.resolve(operation_event("PUT", "batches/late", body), None)["statusCode"] == 200
    record = store.get("batches/late")
    assert record is not None and record.update_time_ns == MAX_EVENT_NS
    for i in range(3):  # three 404 polls in a row
        record = store.get("batches/late")
        assert record is not None
        assert ingest(store, not_found_event(record, 10**18 + i)).applied
    answer = app.resolve(operation_event("GET", "batches/late"), None)
    assert answer["statusCode"] == 200
    assert '"updateTime":"9999-12-31T23:59:59.000000002Z"' in answer["body"]


def test_a_marker_at_the_very_end_is_refused_not_stored() -> None:
    at_end = OpRecord("batches/end", State.RUNNING, MAX_NS, 3, "poll")
    with pytest.raises(InvalidTimeError):
        not_found_event(at_end, 10**18)
    assert record_to_json(at_end)["updateTime"] == format_time(MAX_NS)
