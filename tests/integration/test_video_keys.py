"""A video operation has one key whatever spelling names it, and records keyed the old way
(by the full name, model included) are still found, advanced and read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.domain.events import from_operation
from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.ingest import ingest
from opstate.store.dynamodb import serialize_item
from opstate.store.sqlite import SQLiteStore
from tests.support.stores import Harness, harness_for, signed_app
from tests.support.webhooks import (
    operation_event,
    signed_headers,
    webhook_event,
)

NOW_NS = parse_time("2026-05-10T10:00:00Z")
MODEL = "veo-3.1-generate-preview"
FULL = f"models/{MODEL}/operations/op1"
KEY = "models/-/operations/op1"


@pytest.fixture(params=("sqlite", "dynamodb-mock"))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_for(
        request.param, tmp_path=tmp_path, moto_endpoint=lambda: "", clock=lambda: NOW_NS
    ) as h:
        yield h


def app_for(harness: Harness) -> Any:
    return signed_app(harness.store, NOW_NS)


def call(app: Any, event: dict[str, Any]) -> tuple[int, Any]:
    response = app.resolve(event, None)
    return int(response["statusCode"]), json.loads(response["body"])


def video_generated(data_id: str) -> dict[str, Any]:
    body = json.dumps(
        {
            "type": "video.generated",
            "timestamp": "2026-05-10T09:30:00Z",
            "data": {"id": data_id, "output_file_uri": "files/video-1"},
        }
    ).encode()
    return webhook_event(body, signed_headers(body))


def test_a_bare_webhook_id_meets_the_tracked_full_name(harness: Harness) -> None:
    app = app_for(harness)
    status, answer = call(app, operation_event("PUT", FULL))
    assert (status, answer["name"], answer["state"]) == (200, KEY, "PENDING")
    status, answer = call(app, video_generated("op1"))  # Gemini's bare id
    assert (status, answer["applied"], answer["name"]) == (200, True, KEY)
    assert answer["version"] == 2
    record = harness.store.get(KEY)
    assert record is not None and record.state is State.SUCCEEDED
    # what polling needs to rebuild the full name survives the bare webhook
    assert record.details == {"model": MODEL, "output_file_uri": "files/video-1"}
    assert [r.name for r in harness.store.iter_all()] == [KEY]
    for spelling in (FULL, KEY, f"v1beta/{FULL}"):
        status, got = call(app, operation_event("GET", spelling))
        assert (status, got["name"], got["kind"]) == (200, KEY, "video")


def write_old_record(harness: Harness) -> None:
    """A RUNNING video record as the previous release stored it: keyed by the full name, no
    ``model`` in its details."""
    old = OpRecord(
        FULL,
        State.RUNNING,
        parse_time("2026-05-10T09:00:00Z"),
        2,
        "poll",
        {},
        created_ns=NOW_NS - 10,
        applied_ns=NOW_NS - 5,
    )
    if harness.kind == "sqlite":
        harness.store.put_if_absent(old)
    else:
        item = harness.store.item(old)  # type: ignore[attr-defined]
        harness.client.put_item(TableName=harness.table, Item=serialize_item(item))


def test_an_old_full_name_record_is_found_advanced_and_read(harness: Harness) -> None:
    write_old_record(harness)
    app = app_for(harness)
    # read by any spelling of its name
    status, got = call(app, operation_event("GET", FULL))
    assert (status, got["name"], got["state"]) == (200, FULL, "RUNNING")
    # a webhook naming the full name advances the old record, under its old key
    status, answer = call(app, video_generated(f"v1beta/{FULL}"))
    assert (status, answer["applied"], answer["name"], answer["version"]) == (
        200,
        True,
        FULL,
        3,
    )
    assert harness.store.get(KEY) is None
    record = harness.store.get(FULL)
    assert record is not None and record.state is State.SUCCEEDED
    assert record.details["model"] == MODEL


def test_polling_an_old_record_advances_it_under_its_old_key(harness: Harness) -> None:
    write_old_record(harness)
    # what the reconciler does: normalise the answer for the record's own name, ingest it
    event = from_operation({"name": FULL, "done": True, "response": {}})
    assert event.name == KEY
    decision = ingest(harness.store, event, clock_ns=lambda: NOW_NS)
    assert decision.applied and decision.record is not None
    assert decision.record.name == FULL and decision.record.version == 3
    assert harness.store.get(KEY) is None


def test_the_cli_tracks_with_the_model_and_reads_old_records(tmp_path: Path) -> None:
    from opstate.cli.app import main

    db = tmp_path / "ops.db"
    store_url = f"sqlite:///{db}"
    assert main(["track", FULL, "--store", store_url]) == 0
    store = SQLiteStore(db)
    record = store.get(KEY)
    assert record is not None and record.details == {"model": MODEL}
    # a record an earlier release keyed by the full name of another operation
    old_full = f"models/{MODEL}/operations/old"
    store.put_if_absent(OpRecord(old_full, State.RUNNING, 1, 1, "poll", {}))
    store.close()
    assert main(["get", old_full, "--store", store_url]) == 0
    assert main(["get", "models/-/operations/missing", "--store", store_url]) == 1
