"""The reconciler with the real google-genai client against the fake Gemini API server."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from opstate.config import Settings
from opstate.domain.events import from_report, from_webhook
from opstate.domain.model import OpRecord
from opstate.domain.names import Kind, canonical_name
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.gemini.client import make_client
from opstate.gemini.errors import retry_after_s
from opstate.ingest import ingest
from opstate.observability import metrics
from opstate.reconcile.gateway import GatewayError
from opstate.reconcile.genai_gateway import GenaiGateway
from opstate.reconcile.pacing import Backoff, SystemClock
from opstate.reconcile.run import reconcile_once
from opstate.store import MemoryStore, StoreUnavailableError, WriteOutcome
from tests.support.fake_gemini import FakeGemini, Request

API_KEY = "test-key"
FAST = Backoff(base_s=0.01, max_s=0.05, trip_after=24)
T0 = "2026-05-01T10:00:00Z"
NOW_NS = parse_time("2026-05-02T00:00:00Z")


def settings(**overrides: Any) -> Settings:
    base = Settings(
        store_url="memory://",
        gemini_api_key=API_KEY,
        reconcile_workers=8,
        reconcile_max_pages=5,
        reconcile_open_limit=1000,
        reconcile_safety_margin_s=10.0,
        reconcile_http_timeout_s=0.5,
    )
    return replace(base, **overrides)


@pytest.fixture
def fake(fake_gemini: FakeGemini) -> FakeGemini:
    fake_gemini.api_key = API_KEY  # proves make_client sends the key
    return fake_gemini


@pytest.fixture
def client(fake: FakeGemini, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # The SDK reads GOOGLE_GEMINI_BASE_URL itself; make_client never passes a base URL.
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake.base_url)
    made = make_client(settings())
    yield made
    made.close()


@pytest.fixture(autouse=True)
def fresh_metrics() -> Iterator[None]:
    metrics.clear_metrics()
    yield
    metrics.clear_metrics()


class _WallClock(SystemClock):
    """The real clock, with a settable wall time (``clock_ns``) for the records."""

    def __init__(self, clock_ns: Any) -> None:
        self._clock_ns = clock_ns

    def now_ns(self) -> int:
        return int(self._clock_ns())


def run(store: MemoryStore, client: Any, **kw: Any) -> Any:
    """One run through the google-genai adapter (this file tests the adapter end to end)."""
    s = kw.pop("settings", None) or settings()
    kw.setdefault("backoff", FAST)
    kw.pop("memory", None)
    clock_ns = kw.pop("clock_ns", None)
    if clock_ns is not None:
        kw["clock"] = _WallClock(clock_ns)
    return reconcile_once(store, GenaiGateway(client), settings=s, **kw)


def track(store: MemoryStore, name: str, state: str = "PENDING", time: str = T0) -> OpRecord:
    """Register an operation as the user's producer would (PUT /operations/{name})."""
    event = from_report(name, {"state": state, "updateTime": time}, now_ns=NOW_NS)
    decision = ingest(store, event)
    assert decision.applied and decision.record is not None
    return decision.record


def record(store: MemoryStore, name: str) -> OpRecord:
    found = store.get(canonical_name(name))  # a video's key has no model
    assert found is not None, name
    return found


def metric_values(name: str) -> list[float]:
    entry = metrics.metric_set.get(name)
    return list(entry["Value"]) if entry else []


# --- the seed's story --------------------------------------------------------------------------


def test_late_running_poll_never_overwrites_a_delivered_success(fake, client):
    """The seed bug: the job finished (webhook), then a slow poll read RUNNING."""
    store = MemoryStore()
    track(store, "batches/seed", "RUNNING", "2026-05-01T10:00:00Z")
    # The API answers RUNNING, stamped before the success...
    fake.put_batch("batches/seed", "BATCH_STATE_RUNNING", update_time="2026-05-01T10:01:00Z")
    webhook = {
        "type": "batch.succeeded",
        "timestamp": "2026-05-01T10:05:00Z",
        "data": {"id": "batches/seed", "output_file_uri": "files/out"},
    }
    delivered = []

    def webhook_lands_while_the_poll_is_in_flight(_: Request) -> None:
        delivered.append(ingest(store, from_webhook(webhook)))

    fake.on_request("batches/seed", webhook_lands_while_the_poll_is_in_flight)

    result = run(store, client, settings=settings(reconcile_max_pages=0))

    assert delivered[0].applied
    after = record(store, "batches/seed")
    assert after.state is State.SUCCEEDED
    assert after.version == delivered[0].record.version == 2
    assert after.details["output_file_uri"] == "files/out"
    assert result.polled == 1 and result.dropped == 1 and result.applied == 0

    # Discovery reads the same stale RUNNING again: still nothing moves.
    fake.on_request("batches/seed", None)
    again = run(store, client)
    assert again.discovered == 1 and again.dropped == 1
    assert record(store, "batches/seed") == after


def test_webhook_first_then_stale_listing_keeps_success(fake, client):
    store = MemoryStore()
    webhook = {"type": "batch.succeeded", "timestamp": "2026-05-01T10:05:00Z", "data": {"id": "s"}}
    ingest(store, from_webhook(webhook))
    before = record(store, "batches/s")
    fake.put_batch("batches/s", "BATCH_STATE_RUNNING", update_time="2026-05-01T10:01:00Z")

    result = run(store, client)

    assert result.discovered == 1 and result.dropped == 1 and result.applied == 0
    assert record(store, "batches/s") == before


# --- discovery ---------------------------------------------------------------------------------


def test_discovery_creates_records_for_batches_nobody_registered(fake, client):
    store = MemoryStore()
    states = ["BATCH_STATE_PENDING", "BATCH_STATE_RUNNING", "BATCH_STATE_SUCCEEDED"]
    for i in range(250):
        fake.put_batch(
            f"batches/b{i:03d}",
            states[i % 3],
            update_time="2026-05-01T10:00:00.123456Z",
            display_name=f"job {i}",
            responses_file=f"files/out{i}" if i % 3 == 2 else None,
        )

    result = run(store, client)

    assert result.discovered == 250
    assert result.applied == 250
    assert len(store.all()) == 250
    pending = record(store, "batches/b000")
    assert pending.state is State.PENDING
    assert pending.update_time_ns == parse_time("2026-05-01T10:00:00.123456Z")
    assert pending.details["display_name"] == "job 0"
    done = record(store, "batches/b002")
    assert done.state is State.SUCCEEDED and done.details["output_file_uri"] == "files/out2"
    # Three pages of 100, and no per-job poll for what the listing already said.
    assert fake.hits("batches") == 3
    assert not [r for r in fake.requests if r.name.startswith("batches/")]


def test_discovery_is_bounded_by_max_pages(fake, client):
    store = MemoryStore()
    for i in range(250):
        fake.put_batch(f"batches/b{i:03d}", "BATCH_STATE_RUNNING")

    result = run(store, client, settings=settings(reconcile_max_pages=2))

    assert result.discovered == 200 and len(store.all()) == 200
    assert fake.hits("batches") == 2


def test_a_quiet_listing_waits_its_cadence_and_a_changed_one_lists_again_next_run(fake, client):
    """Issue 48: with a pace (the AWS wiring's ``DISCOVERY_CADENCE``, 15 minutes), a listing
    that changed nothing is followed by the next one 15 minutes later; one that found a change
    by one at the next run. A batch nobody tracks is found within the cadence plus a run."""
    from opstate.outcomes.redrive import Cadence

    store = MemoryStore()
    fake.put_batch("batches/a", "BATCH_STATE_RUNNING", update_time=T0)
    pace = Cadence(900.0)
    now = [NOW_NS]

    def every_5_minutes() -> int:
        return now[0]

    def next_run() -> Any:
        result = run(store, client, discovery=pace, clock_ns=every_5_minutes)
        now[0] += 300 * 1_000_000_000
        return result

    assert next_run().discovered == 1  # a new record: a change
    assert next_run().discovered == 1  # listed again at the next run: nothing new, quiet
    assert fake.hits("batches") == 2
    assert next_run().discovered == 0 and next_run().discovered == 0  # 5 and 10 minutes on
    assert fake.hits("batches") == 2
    fake.put_batch("batches/b", "BATCH_STATE_RUNNING", update_time=T0)
    assert next_run().discovered == 2  # 15 minutes after the quiet listing
    assert record(store, "batches/b").state is State.RUNNING
    assert fake.hits("batches") == 3
    assert next_run().discovered == 2  # it found a change: listed at the next run again
    assert next_run().discovered == 0
    # Without a pace (local runs, `opstate reconcile --once`), every run lists.
    run(store, client)
    run(store, client)
    assert fake.hits("batches") == 6


# --- polling by kind ---------------------------------------------------------------------------


def test_tracked_video_operations_finish_or_are_cancelled(fake, client):
    store = MemoryStore()
    done = "models/veo-3.1-generate-preview/operations/done"
    cancelled = "models/veo-3.1-generate-preview/operations/cancelled"
    running = "models/veo-3.1-generate-preview/operations/running"
    for name in (done, cancelled, running):
        track(store, name)
    fake.put_video(done, done=True, video_uri="https://example.invalid/v.mp4")
    fake.put_video(cancelled, done=True, error_code=1, error_message="Operation cancelled")
    fake.put_video(running, done=False)

    result = run(store, client, settings=settings(reconcile_max_pages=0))

    assert result.polled == 3 and result.applied == 3 and result.errors == 0
    finished = record(store, done)
    assert finished.state is State.SUCCEEDED and finished.version == 2
    assert finished.details["video_uri"] == "https://example.invalid/v.mp4"
    gone = record(store, cancelled)
    assert gone.state is State.CANCELLED and gone.details["error_code"] == 1
    assert record(store, running).state is State.RUNNING
    paths = {r.path for r in fake.requests if r.name == done}
    assert paths == {f"/v1/{done}"}


def test_interactions_and_file_search_imports_are_polled(fake, client):
    store = MemoryStore()
    track(store, "interactions/i-done")
    track(store, "interactions/i-act")
    track(store, "fileSearchStores/store1/operations/imp1")
    fake.put_interaction("interactions/i-done", "completed", updated="2026-05-01T11:00:00Z")
    fake.put_interaction("interactions/i-act", "requires_action", updated="2026-05-01T11:00:00Z")
    fake.put_operation(
        "fileSearchStores/store1/operations/imp1",
        done=True,
        response={"@type": "x", "documentName": "fileSearchStores/store1/documents/d"},
    )

    result = run(store, client, settings=settings(reconcile_max_pages=0))

    assert result.polled == 3 and result.applied == 3
    completed = record(store, "interactions/i-done")
    assert completed.state is State.SUCCEEDED
    assert completed.update_time_ns == parse_time("2026-05-01T11:00:00Z")
    assert record(store, "interactions/i-act").state is State.REQUIRES_ACTION
    imported = record(store, "fileSearchStores/store1/operations/imp1")
    assert imported.state is State.SUCCEEDED and imported.kind is Kind.FILE_SEARCH_IMPORT
    assert fake.hits("interactions/i-done") == 1


def test_unchanged_answers_write_nothing(fake, client):
    store = MemoryStore()
    before = track(store, "batches/same", "RUNNING", T0)
    fake.put_batch("batches/same", "BATCH_STATE_RUNNING", update_time=T0)

    result = run(store, client, settings=settings(reconcile_max_pages=0))

    assert result.polled == 1 and result.dropped == 1 and result.applied == 0
    assert record(store, "batches/same") == before


def test_unknown_source_state_is_dropped_not_applied(fake, client):
    store = MemoryStore()
    before = track(store, "batches/odd", "RUNNING", T0)
    fake.put_batch("batches/odd", "BATCH_STATE_UNSPECIFIED", update_time="2026-05-01T12:00:00Z")

    result = run(store, client, settings=settings(reconcile_max_pages=0))

    assert result.dropped == 1 and result.errors == 0
    assert record(store, "batches/odd") == before


# --- errors ------------------------------------------------------------------------------------


def test_not_found_keeps_the_record_unchanged(fake, client):
    store = MemoryStore()
    before = track(store, "batches/gone", "RUNNING", T0)

    first = run(store, client, settings=settings(reconcile_max_pages=0))

    assert first.not_found == 1 and first.applied == 0 and first.errors == 0
    assert metric_values("NotFound") == [1.0]
    assert record(store, "batches/gone") == before
    poll = store.poll_state("batches/gone")
    assert poll is not None and poll.misses == 1 and not poll.lost


def test_retry_after_of_a_429_reaches_the_run(fake, client):
    """The adapter reads Retry-After (seconds or an HTTP date) into the GatewayError."""
    store = MemoryStore()
    tracked = track(store, "batches/slow", "RUNNING", T0)
    fake.fail("batches/slow", 429, times=1, retry_after="3")
    with pytest.raises(GatewayError) as caught:
        GenaiGateway(client).fetch(tracked)
    assert caught.value.status == 429 and caught.value.transient
    assert caught.value.retry_after_s == 3.0
    http_date = {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}
    assert retry_after_s(http_date, now_s=1445412470.0) == 10.0
    fake.fail("batches/slow", 404, times=1)
    with pytest.raises(GatewayError) as missing:
        GenaiGateway(client).fetch(tracked)
    assert missing.value.not_found and not missing.value.transient


def test_429_500_and_timeouts_leave_operations_for_the_next_run(fake, client):
    store = MemoryStore()
    names = [f"batches/op{i}" for i in range(8)]
    for i, name in enumerate(names):
        track(store, name, "RUNNING", f"2026-05-01T10:00:0{i}Z")
        fake.put_batch(name, "BATCH_STATE_SUCCEEDED", update_time="2026-05-01T11:00:00Z")
    track(store, "interactions/busy", "RUNNING", "2026-05-01T10:00:09Z")
    fake.put_interaction("interactions/busy", "completed", updated="2026-05-01T11:00:00Z")
    fake.fail("batches/op0", 429)
    fake.fail("batches/op1", 500)
    fake.fail("batches/op2", 503)
    fake.fail("interactions/busy", 429)
    fake.delay("batches/op3", 5.0)  # longer than the 0.5 s client timeout
    befores = {n: record(store, n) for n in [*names[:4], "interactions/busy"]}

    first = run(store, client, settings=settings(reconcile_max_pages=0))

    assert first.polled == 9
    assert first.errors == 5
    assert first.applied == 4 and first.remaining_due == 0 and not first.stopped_early
    for name, before in befores.items():
        assert record(store, name) == before, name
    for name in names[4:]:
        assert record(store, name).state is State.SUCCEEDED
    # The SDK itself never retried: one request per operation.
    assert fake.hits("batches/op0") == 1 and fake.hits("interactions/busy") == 1
    assert metric_values("Errors") == [5.0]
    # The dashboard's 429 line; every due operation was reached.
    assert metric_values("Throttled") == [2.0]
    assert metric_values("RemainingDue") == [0.0]

    for name in ["batches/op0", "batches/op1", "batches/op2", "interactions/busy"]:
        fake.clear_fault(name)
    fake.delay("batches/op3", 0)
    second = run(store, client, settings=settings(reconcile_max_pages=0))

    assert second.polled == 5 and second.applied == 5 and second.errors == 0
    assert all(r.state is State.SUCCEEDED for r in store.all())


def test_an_unhealthy_api_stops_the_run_instead_of_burning_the_budget(fake, client):
    store = MemoryStore()
    for i in range(60):
        name = f"batches/x{i:02d}"
        track(store, name, "RUNNING", f"2026-05-01T10:00:{i:02d}Z")
        fake.fail(name, 503)
    backoff = Backoff(base_s=0.001, max_s=0.002, trip_after=10)

    result = run(
        store,
        client,
        settings=settings(reconcile_max_pages=0, reconcile_workers=4),
        backoff=backoff,
    )

    assert result.stopped_early
    assert 10 <= result.polled < 20  # at most the in-flight ones after the breaker trips
    assert result.remaining_due == 60 - result.polled
    assert result.errors == result.polled


def test_store_faults_count_as_errors_and_others_go_on(fake, client):
    class FlakyStore(MemoryStore):
        # A poll's answer is written against the record the run listed (no read first): the
        # fault comes from the write.
        def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
            if record.name == "batches/flaky":
                raise StoreUnavailableError("throttled")
            return super().replace_if_version(record, expected_version)

    store = FlakyStore()
    for name in ("batches/flaky", "batches/fine"):
        track_store = MemoryStore()
        rec = track(track_store, name, "RUNNING", T0)
        store.put_if_absent(rec)
        fake.put_batch(name, "BATCH_STATE_SUCCEEDED", update_time="2026-05-01T11:00:00Z")

    result = run(store, client, settings=settings(reconcile_max_pages=0))

    assert result.errors == 1 and result.applied == 1
    assert store.all()[0].name == "batches/fine" and store.all()[0].state is State.SUCCEEDED


def test_discovery_failure_does_not_stop_polling(fake, client):
    store = MemoryStore()
    track(store, "batches/p", "RUNNING", T0)
    fake.put_batch("batches/p", "BATCH_STATE_SUCCEEDED", update_time="2026-05-01T11:00:00Z")
    fake.fail("batches", 500)
    fake.fail("webhooks", 403)

    result = run(store, client)

    assert result.errors == 2 and result.discovered == 0
    assert result.polled == 1 and record(store, "batches/p").state is State.SUCCEEDED


# --- budget ------------------------------------------------------------------------------------


class FakeBudget:
    """``remaining_ms``: every call spends ``step_ms`` (thread-safe)."""

    def __init__(self, start_ms: int, step_ms: int) -> None:
        self.left = start_ms
        self.step = step_ms
        self.lock = threading.Lock()

    def __call__(self) -> int:
        with self.lock:
            self.left -= self.step
            return self.left


def test_an_exhausted_budget_starts_nothing(fake, client):
    store = MemoryStore()
    track(store, "batches/a", "RUNNING", T0)

    result = run(store, client, remaining_ms=lambda: 5_000)

    assert result.stopped_early and result.polled == 0 and result.remaining_due == 1
    assert fake.requests == []


# --- webhook health ----------------------------------------------------------------------------


def test_a_disabled_webhook_is_logged_at_error_level_and_counted(fake, client, caplog):
    fake.put_webhook("wh-ok", name="healthy", state="enabled")
    fake.put_webhook("wh-bad", name="prod-endpoint", state="disabled_due_to_failed_deliveries")
    fake.put_webhook("wh-off", state="disabled")

    with caplog.at_level(logging.INFO):
        run(MemoryStore(), client)

    assert metric_values("WebhooksDisabled") == [2.0]
    errors = [r for r in caplog.records if r.getMessage() == "webhook not enabled"]
    assert {(r.levelname, r.webhook, r.webhook_state) for r in errors} == {
        ("ERROR", "prod-endpoint", "disabled_due_to_failed_deliveries"),
        ("ERROR", "wh-off", "disabled"),
    }


def test_healthy_webhooks_count_zero(fake, client):
    fake.put_webhook("wh-ok", name="healthy", state="enabled")

    result = run(MemoryStore(), client)

    assert metric_values("WebhooksDisabled") == [0.0]
    assert result.errors == 0


def test_every_result_field_is_a_metric(fake, client):
    store = MemoryStore()
    track(store, "batches/gone", "RUNNING", T0)
    fake.put_batch("batches/new", "BATCH_STATE_RUNNING")

    result = run(store, client)

    expected = {
        "Discovered": result.discovered,
        "Polled": result.polled,
        "Applied": result.applied,
        "Dropped": result.dropped,
        "NotFound": result.not_found,
        "OperationsLost": result.lost,
        "OperationsOverdue": result.overdue,
        "Errors": result.errors,
        "Throttled": result.throttled,
        "RemainingDue": result.remaining_due,
        "StoppedEarly": int(result.stopped_early),
    }
    assert {k: metric_values(k) for k in expected} == {k: [float(v)] for k, v in expected.items()}
    assert result.as_dict() == {
        "discovered": 1,
        "polled": 1,
        "applied": 1,
        "dropped": 0,
        "not_found": 1,
        "lost": 0,
        "overdue": 0,
        "errors": 0,
        "throttled": 0,
        "remaining_due": 0,
        "stopped_early": False,
    }


def test_oldest_open_age_is_published_for_the_alarm(fake, client):
    store = MemoryStore()
    for name, created_s in (("batches/young", 3_600), ("batches/old", 7_200)):
        event = from_report(name, {"state": "RUNNING", "updateTime": T0}, now_ns=NOW_NS)
        ingest(store, event, clock_ns=lambda s=created_s: NOW_NS - s * 1_000_000_000)
        fake.put_batch(name, "BATCH_STATE_RUNNING", update_time=T0)

    run(store, client, settings=settings(reconcile_max_pages=0), clock_ns=lambda: NOW_NS)

    assert metric_values("OldestOpenAgeSeconds") == [7_200.0]


def test_oldest_open_age_is_zero_when_nothing_is_open(fake, client):
    run(MemoryStore(), client, settings=settings(reconcile_max_pages=0))

    assert metric_values("OldestOpenAgeSeconds") == [0.0]


# --- issue 24: what the real SDK hands over for edge answers ----------------------------------


def test_filtered_videos_error_code_zero_and_naive_times_through_the_sdk(fake, client):
    store = MemoryStore()
    filtered = "models/veo-3.1-generate-preview/operations/filtered"
    ok_status = "models/veo-3.1-generate-preview/operations/ok-status"
    naive = "batches/naive-time"
    for name in (filtered, ok_status, naive):
        track(store, name)
    fake.put_operation(
        filtered,
        done=True,
        response={
            "generateVideoResponse": {
                "raiMediaFilteredCount": 2,
                "raiMediaFilteredReasons": ["reason one", "reason two"],
            },
        },
    )
    fake.put(
        ok_status,
        {
            "name": ok_status,
            "done": True,
            "error": {"code": 0, "message": ""},
            "response": {"generateVideoResponse": {"generatedSamples": []}},
        },
    )
    # A REST time without an offset: the SDK parses it as a naive datetime.
    fake.put_batch(naive, "BATCH_STATE_RUNNING", update_time="2026-05-01T10:30:00")

    result = run(store, client, settings=settings(reconcile_max_pages=0))

    assert result.polled == 3 and result.errors == 0, result
    done = record(store, filtered)
    assert done.state is State.SUCCEEDED
    assert done.details["rai_media_filtered_count"] == 2
    assert done.details["rai_media_filtered_reasons"] == ["reason one", "reason two"]
    assert record(store, ok_status).state is State.SUCCEEDED
    polled = record(store, naive)
    assert (polled.state, polled.update_time_ns) == (
        State.RUNNING,
        parse_time("2026-05-01T10:30:00Z"),
    )


# --- issue 31: a running batch's progress, whichever way the run read it ----------------------

BATCH_STATS = {
    "requestCount": "100",
    "successfulRequestCount": "40",
    "failedRequestCount": "2",
    "pendingRequestCount": "58",
}
PROGRESS = {
    "requestCount": 100,
    "successfulRequestCount": 40,
    "failedRequestCount": 2,
    "pendingRequestCount": 58,
}


def put_running_with_stats(fake: FakeGemini, name: str, stats: dict[str, str]) -> None:
    """A RUNNING batch whose REST resource (``GET`` and the listing) carries ``batchStats``."""
    fake.put_batch(name, "BATCH_STATE_RUNNING", update_time=T0)
    body = fake.resource(name) or {}
    body["metadata"]["batchStats"] = dict(stats)
    fake.put(name, body)


@pytest.mark.parametrize("created", ["now", "long-ago"])  # long ago: the poll marks it overdue
@pytest.mark.parametrize("tracked", ["RUNNING", "PENDING"])  # the answer dropped, or applied
@pytest.mark.parametrize("path", ["listed", "polled"])
def test_a_running_batch_keeps_its_progress_whichever_way_it_was_read(
    fake: FakeGemini, client: Any, path: str, tracked: str, created: str
) -> None:
    store = MemoryStore()
    event = from_report("batches/run", {"state": tracked, "updateTime": T0}, now_ns=NOW_NS)
    if created == "long-ago":
        assert ingest(store, event, clock_ns=lambda: NOW_NS).applied
    else:
        assert ingest(store, event).applied
    put_running_with_stats(fake, "batches/run", BATCH_STATS)

    pages = 5 if path == "listed" else 0
    result = run(store, client, settings=settings(reconcile_max_pages=pages))

    assert result.errors == 0 and result.overdue == (1 if created == "long-ago" else 0)
    if path == "listed":
        # Discovery read it: rescheduled from the listing, no request of its own.
        assert (result.discovered, result.polled, fake.hits("batches/run")) == (1, 0, 0)
    else:
        assert (result.discovered, result.polled, fake.hits("batches/run")) == (0, 1, 1)
    assert record(store, "batches/run").state is State.RUNNING
    assert store.get_progress("batches/run") == PROGRESS


def test_the_next_listing_s_progress_replaces_the_last(fake: FakeGemini, client: Any) -> None:
    store = MemoryStore()
    track(store, "batches/run", "RUNNING", T0)
    put_running_with_stats(fake, "batches/run", BATCH_STATS)
    run(store, client)
    later = {**BATCH_STATS, "successfulRequestCount": "90", "pendingRequestCount": "8"}
    put_running_with_stats(fake, "batches/run", later)
    # The next run, once the record is due again (a day later on the wall).
    result = run(store, client, clock_ns=lambda: time.time_ns() + 86_400 * 10**9)
    assert (result.discovered, result.polled, result.errors) == (1, 0, 0)
    assert store.get_progress("batches/run") == {
        **PROGRESS,
        "successfulRequestCount": 90,
        "pendingRequestCount": 8,
    }
    assert fake.hits("batches/run") == 0


def test_a_listed_batch_is_read_as_a_polled_one_is(fake: FakeGemini, client: Any) -> None:
    """The listing and ``GET batches/{id}`` give the same event: error, output, name."""
    fake.put_batch(
        "batches/failed",
        "BATCH_STATE_FAILED",
        update_time=T0,
        error={"code": 3, "message": "bad input"},
    )
    fake.put_batch("batches/ok", "BATCH_STATE_SUCCEEDED", responses_file="files/out-ok")
    listed = {name: event for page in GenaiGateway(client).batch_pages(10) for name, event in page}
    for name in ("batches/failed", "batches/ok"):
        tracked = track(MemoryStore(), name)
        assert listed[name] == GenaiGateway(client).fetch(tracked)
    assert listed["batches/failed"].details["error_code"] == 3  # type: ignore[union-attr]
    assert fake.hits("batches") == 1
