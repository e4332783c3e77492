"""A Google Cloud job has one key whatever case its location is written in, names outside
Google's alphabet are refused and write nothing, and a record an earlier release keyed with the
location as written is still polled to its end and read by that spelling."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from opstate.config import Settings
from opstate.domain.events import from_report
from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.gemini.client import make_client
from opstate.ingest import ingest
from opstate.reconcile.cloud_gateway import GoogleCloudGateway
from opstate.reconcile.genai_gateway import GenaiGateway
from opstate.reconcile.pacing import Backoff
from opstate.reconcile.run import reconcile_once
from opstate.store import MemoryStore
from opstate.store.dynamodb import serialize_item
from opstate.store.sqlite import SQLiteStore
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_google_cloud import GoogleCloudSide, cloud_batch_resource
from tests.support.stores import Harness, harness_for, signed_app
from tests.support.webhooks import operation_event

NOW_NS = parse_time("2026-05-10T10:00:00Z")
KEY = "projects/p1/locations/us-central1/batchPredictionJobs/7"
CAPITALS = "projects/p1/locations/US-CENTRAL1/batchPredictionJobs/7"
FAST = Backoff(base_s=0.01, max_s=0.05, trip_after=24)


@pytest.fixture(params=("sqlite", "dynamodb-mock"))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_for(
        request.param, tmp_path=tmp_path, moto_endpoint=lambda: "", clock=lambda: NOW_NS
    ) as h:
        yield h


def call(app: Any, event: dict[str, Any]) -> tuple[int, Any]:
    response = app.resolve(event, None)
    return int(response["statusCode"]), json.loads(response["body"])


def names(harness: Harness) -> list[str]:
    return [r.name for r in harness.store.iter_all()]


def write_old_record(harness: Harness, name: str = CAPITALS) -> None:
    """A RUNNING Cloud job as the previous release stored a report spelled with capitals."""
    old = OpRecord(
        name,
        State.RUNNING,
        parse_time("2026-05-10T09:00:00Z"),
        2,
        "report",
        {},
        created_ns=NOW_NS - 10,
        applied_ns=NOW_NS - 5,
    )
    if harness.kind == "sqlite":
        harness.store.put_if_absent(old)
    else:
        item = harness.store.item(old)  # type: ignore[attr-defined]
        harness.client.put_item(TableName=harness.table, Item=serialize_item(item))


def test_a_location_in_any_case_meets_on_one_record(harness: Harness) -> None:
    app = signed_app(harness.store, NOW_NS)
    status, answer = call(app, operation_event("PUT", CAPITALS))
    assert (status, answer["name"], answer["state"]) == (200, KEY, "PENDING")
    for spelling in (KEY, "projects/p1/locations/Us-Central1/batchPredictionJobs/7:cancel"):
        status, got = call(app, operation_event("GET", spelling))
        assert (status, got["name"], got["backend"]) == (200, KEY, "google-cloud")
    assert names(harness) == [KEY]


@pytest.mark.parametrize(
    ("spelling", "why"),
    [
        # The spelling: '#' (%23 in a path) cut it to the key .../locations/evil.example
        ("projects/p1/locations/evil.example%23/batchPredictionJobs/1", "location is letters"),
        ("projects/p1/locations/us-central1%23/batchPredictionJobs/1", "must be a batch job"),
        ("projects/P1/locations/us-central1/batchPredictionJobs/1", "project id is lowercase"),
        ("projects/p_1/locations/us-central1/batchPredictionJobs/1", "project id is lowercase"),
    ],
)
def test_a_name_outside_google_s_alphabet_is_refused_and_writes_nothing(
    harness: Harness, spelling: str, why: str
) -> None:
    app = signed_app(harness.store, NOW_NS)
    for method in ("PUT", "GET"):
        status, answer = call(app, operation_event(method, spelling))
        assert (status, answer["error"]) == (400, "invalid-name")
        assert why in answer["message"]
    assert names(harness) == []


def test_an_old_record_keyed_with_capitals_is_read_and_advanced(harness: Harness) -> None:
    write_old_record(harness)
    app = signed_app(harness.store, NOW_NS)
    # Read by the spelling it was stored under.
    status, got = call(app, operation_event("GET", CAPITALS))
    assert (status, got["name"], got["state"]) == (200, CAPITALS, "RUNNING")
    # What the reconciler does with it: the answer (Google's lowercase name) renamed to the
    # record polled, ingested: the old record ends, under its old key.
    event = replace(
        from_report(KEY, {"state": "SUCCEEDED", "updateTime": "2026-05-10T09:30:00Z"}, now_ns=0),
        name=CAPITALS,
    )
    decision = ingest(harness.store, event, clock_ns=lambda: NOW_NS)
    assert decision.applied and decision.record is not None
    assert (decision.record.name, decision.record.version) == (CAPITALS, 3)
    assert names(harness) == [CAPITALS]


def test_the_cli_reads_an_old_record_by_its_spelling(tmp_path: Path) -> None:
    from opstate.cli.app import main

    db = tmp_path / "ops.db"
    store_url = f"sqlite:///{db}"
    store = SQLiteStore(db)
    store.put_if_absent(OpRecord(CAPITALS, State.RUNNING, 1, 1, "report", {}))
    store.close()
    assert main(["get", CAPITALS, "--store", store_url]) == 0
    assert main(["get", CAPITALS.replace("/7", "/8"), "--store", store_url]) == 1
    # A bad name is one sentence and no record.
    assert main(["track", "projects/p1/locations/evil.example#/x", "--store", store_url]) != 0
    store = SQLiteStore(db)
    assert [r.name for r in store.iter_all()] == [CAPITALS]
    store.close()


# --- through the real google-genai client in enterprise mode -----------------------------------


@pytest.fixture
def cloud(fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch) -> GoogleCloudSide:
    monkeypatch.setenv("GOOGLE_VERTEX_BASE_URL", fake_gemini.base_url)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    for name in ("GOOGLE_API_KEY", "GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION"):
        monkeypatch.delenv(name, raising=False)
    return GoogleCloudSide(fake_gemini)


def run_cloud(store: MemoryStore, cloud: GoogleCloudSide, tmp_path: Path, **kw: Any) -> Any:
    key = tmp_path / "sa.json"
    key.write_text(json.dumps(cloud.service_account_info()))
    s = replace(
        Settings(store_url="memory://", gemini_api_key="test-key", reconcile_workers=2),
        google_application_credentials=str(key),
        reconcile_http_timeout_s=2.0,
        **kw,
    )
    gemini, google = GenaiGateway(make_client(s)), GoogleCloudGateway(s)
    try:
        return reconcile_once(store, gemini, settings=s, backoff=FAST, cloud=google)
    finally:
        gemini.close()
        google.close()


def test_a_job_tracked_with_capitals_and_discovered_is_one_record(
    fake_gemini: FakeGemini, cloud: GoogleCloudSide, tmp_path: Path
) -> None:
    fake_gemini.put(KEY, cloud_batch_resource(KEY, "SUCCEEDED"))  # Google's name: lowercase
    store = MemoryStore()
    ingest(store, from_report(CAPITALS, {"updateTime": "2026-05-01T09:30:00Z"}, now_ns=NOW_NS))
    result = run_cloud(
        store, cloud, tmp_path, google_cloud_scopes=(("p1", "us-central1"),), reconcile_max_pages=1
    )
    assert result.discovered == 1 and result.errors == 0
    assert [r.name for r in store.all()] == [KEY]
    found = store.get(KEY)
    assert found is not None and found.state is State.SUCCEEDED


def test_an_old_record_keyed_with_capitals_is_polled_to_its_end(
    fake_gemini: FakeGemini, cloud: GoogleCloudSide, tmp_path: Path
) -> None:
    # Google answers the spelling asked for with its own (lowercase) name.
    fake_gemini.put(CAPITALS, cloud_batch_resource(KEY, "SUCCEEDED"))
    store = MemoryStore()
    store.put_if_absent(OpRecord(CAPITALS, State.RUNNING, 1, 1, "report", {}))
    result = run_cloud(store, cloud, tmp_path, reconcile_max_pages=0)
    assert (result.polled, result.applied, result.errors) == (1, 1, 0)
    assert [r.name for r in store.all()] == [CAPITALS]
    old = store.get(CAPITALS)
    assert old is not None and old.state is State.SUCCEEDED
