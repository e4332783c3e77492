"""The HTTP API's response contract, on MemoryStore and with the verifier's clock frozen."""

from __future__ import annotations

import base64
import io
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from opstate.api import create_app
from opstate.config import Settings
from opstate.domain.model import Decision, OpRecord
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.observability import SERVICE, logger, metrics
from opstate.quarantine import Delivery, MemoryQuarantine, QuarantineUnavailableError
from opstate.signatures import SecretsUnavailableError, StaticSecretsVerifier
from opstate.store import MemoryStore
from opstate.store.port import StoreUnavailableError, WriteOutcome
from tests.support.webhooks import (
    EVENT_TIMESTAMP,
    OTHER_SECRET,
    ROTATED_SECRET,
    TEST_SECRET,
    compact,
    http_event,
    operation_event,
    signed_headers,
    webhook_event,
)

NOW_NS = parse_time("2026-05-10T10:00:00Z")


def verifier(*secrets: str) -> StaticSecretsVerifier:
    return StaticSecretsVerifier(secrets or (TEST_SECRET,), clock_s=lambda: EVENT_TIMESTAMP)


@dataclass
class Api:
    store: Any
    decisions: list[Decision] = field(default_factory=list)
    settings: Settings = field(default_factory=Settings)
    verifier: Any = None
    quarantine: MemoryQuarantine = field(default_factory=MemoryQuarantine)

    def __post_init__(self) -> None:
        self.app = create_app(
            store=self.store,
            verifier=self.verifier or verifier(TEST_SECRET, ROTATED_SECRET),
            settings=self.settings,
            clock_ns=lambda: NOW_NS,
            on_decision=self.decisions.append,
            quarantine=self.quarantine,
        )

    def call(self, event: Mapping[str, Any]) -> tuple[int, dict[str, str], Any]:
        response = self.app.resolve(dict(event), None)  # type: ignore[arg-type]
        body = response.get("body") or ""
        if response.get("isBase64Encoded"):
            body = base64.b64decode(body).decode()
        headers = {k.lower(): v for k, v in (response.get("headers") or {}).items()}
        assert headers.get("content-type") == "application/json"
        return response["statusCode"], headers, json.loads(body)

    def webhook(
        self, body: bytes, *, secrets: tuple[str, ...] = (TEST_SECRET,), **kw: Any
    ) -> tuple[int, dict[str, str], Any]:
        return self.call(webhook_event(body, signed_headers(body, secrets=secrets), **kw))


@pytest.fixture
def api() -> Api:
    return Api(MemoryStore())


@pytest.fixture
def buffered_metrics() -> Iterator[dict[str, Any]]:
    """Metrics without dimensions are buffered until the Lambda entry flushes them."""
    metrics.clear_metrics()
    try:
        yield metrics.metric_set
    finally:
        metrics.clear_metrics()


@pytest.fixture
def logs() -> Iterator[Callable[[], str]]:
    """The JSON log lines the Powertools logger writes during the test."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logger.registered_formatter)
    std = logging.getLogger(SERVICE)
    std.addHandler(handler)
    try:
        yield stream.getvalue
    finally:
        std.removeHandler(handler)


def parse_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def webhook_body(event_type: str = "batch.succeeded", **data: Any) -> bytes:
    return compact(
        {
            "type": event_type,
            "version": "v1",
            "timestamp": "2026-05-10T09:59:00Z",
            "data": {"id": "batches/b1", **data},
        }
    )


# --- webhook: the happy paths --------------------------------------------------------------------


def test_signed_webhook_is_applied(api: Api) -> None:
    status, _, body = api.webhook(webhook_body(output_file_uri="files/out"))
    assert status == 200
    assert body == {
        "applied": True,
        "reason": "created",
        "name": "batches/b1",
        "state": "SUCCEEDED",
        "version": 1,
    }
    record = api.store.get("batches/b1")
    assert record.state is State.SUCCEEDED
    assert record.details == {"output_file_uri": "files/out"}
    assert record.update_time_ns == parse_time("2026-05-10T09:59:00Z")
    assert [d.reason for d in api.decisions] == ["created"]


def test_rotated_secret_and_base64_body(api: Api) -> None:
    status, _, body = api.webhook(webhook_body(), secrets=(ROTATED_SECRET,), base64_encoded=True)
    assert (status, body["applied"], body["state"]) == (200, True, "SUCCEEDED")


def test_duplicate_delivery_is_dropped_with_the_stored_state(api: Api) -> None:
    api.webhook(webhook_body())
    status, _, body = api.webhook(webhook_body())
    assert status == 200
    assert body == {
        "applied": False,
        "reason": "stale-or-equal-update-time",
        "name": "batches/b1",
        "state": "SUCCEEDED",
        "version": 1,
    }
    assert [d.applied for d in api.decisions] == [True, False]


def test_terminal_conflict_first_terminal_wins(api: Api) -> None:
    api.webhook(webhook_body())
    status, _, body = api.webhook(webhook_body("batch.failed"))
    assert (status, body["applied"], body["reason"], body["state"]) == (
        200,
        False,
        "terminal-conflict",
        "SUCCEEDED",
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (compact({"type": "batch.paused", "data": {"id": "batches/b1"}}), "unsupported-event-type"),
        (compact({"type": "model.tuned", "data": "not even an object"}), "unsupported-event-type"),
    ],
)
def test_unsupported_event_is_200_not_applied_logged_and_counted(
    api: Api,
    body: bytes,
    reason: str,
    capsys: pytest.CaptureFixture[str],
    logs: Callable[[], str],
) -> None:
    status, _, answer = api.webhook(body)
    assert status == 200
    assert answer["applied"] is False
    assert answer["reason"] == reason
    assert api.store.all() == []
    lines = parse_lines(logs())
    warnings = [x for x in lines if x.get("level") == "WARNING" and x.get("reason") == reason]
    assert warnings, lines
    assert warnings[0]["webhook_id"] == "msg_2abc0sample"
    metrics = parse_lines(capsys.readouterr().out)
    assert [x for x in metrics if "EventsDropped" in x and x.get("reason") == reason], metrics


def test_unsupported_type_names_the_operation_when_it_can(api: Api) -> None:
    _, _, answer = api.webhook(compact({"type": "batch.paused", "data": {"id": "b7"}}))
    assert answer["name"] == "batches/b7"
    assert answer["state"] is None
    assert answer["version"] == 0


# --- webhook: refusals ---------------------------------------------------------------------------


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


# (case id, body, expected error code)
BAD_WEBHOOKS: list[tuple[str, bytes, str]] = [
    ("malformed JSON", b'{"type": "batch.succeeded",', "malformed-json"),
    ("empty body", b"", "malformed-json"),
    (
        "NaN",
        b'{"type": "batch.succeeded", "data": {"id": "batches/b1", "x": NaN}}',
        "malformed-json",
    ),
    ("deeply nested", deep(100_000), "malformed-json"),
    ("huge integer", b'{"n": ' + b"9" * 5000 + b"}", "malformed-json"),
    ("a list", b"[1, 2]", "invalid-body"),
    ("a string", b'"batch.succeeded"', "invalid-body"),
    ("null", b"null", "invalid-body"),
    ("missing type", compact({"data": {"id": "batches/b1"}}), "missing-field"),
    ("type not a string", compact({"type": 5, "data": {"id": "batches/b1"}}), "missing-field"),
    ("missing data", compact({"type": "batch.succeeded"}), "missing-field"),
    ("data not an object", compact({"type": "batch.succeeded", "data": [1]}), "missing-field"),
    ("missing id", compact({"type": "batch.succeeded", "data": {}}), "missing-field"),
    ("invalid name", webhook_body(id="batches/has space"), "invalid-name"),
    ("dot-dot name", webhook_body(id="batches/../x"), "invalid-name"),
    (
        "unparseable time",
        compact({"type": "batch.succeeded", "timestamp": "yesterday", "data": {"id": "b1"}}),
        "invalid-time",
    ),
    (
        "numeric time",
        compact({"type": "batch.succeeded", "timestamp": 1778407200, "data": {"id": "b1"}}),
        "invalid-time",
    ),
]


@pytest.mark.parametrize(
    ("body", "code"), [c[1:] for c in BAD_WEBHOOKS], ids=[c[0] for c in BAD_WEBHOOKS]
)
def test_signed_webhooks_we_cannot_read_are_kept_never_refused(
    api: Api, body: bytes, code: str, buffered_metrics: dict[str, Any]
) -> None:
    """A delivery that passed the signature check is Gemini's: a 4xx would be retried for a day
    and then disable the endpoint. It is kept whole in the quarantine and answered 200."""
    status, _, answer = api.webhook(body)
    assert status == 200
    assert answer["applied"] is False and answer["reason"] == "quarantined"
    assert answer["error"] == code
    (kept,) = api.quarantine.all()
    assert kept.body == body and kept.reason == code and kept.message
    assert kept.id == answer["quarantineId"] and kept.webhook_id == "msg_2abc0sample"
    assert kept.received_ns == NOW_NS
    assert buffered_metrics["WebhooksQuarantined"]["Value"] == [1.0]
    assert api.store.all() == []
    assert api.decisions == []


def test_a_webhook_that_cannot_be_kept_is_503_never_200(api: Api) -> None:
    class Down(MemoryQuarantine):
        def put(self, delivery: Delivery) -> None:
            raise QuarantineUnavailableError("queue down")

    down = Api(MemoryStore(), quarantine=Down())
    status, headers, answer = down.webhook(b"{")
    assert (status, answer["error"]) == (503, "unavailable")
    assert headers.get("retry-after") == "5"


def test_an_unsigned_unreadable_webhook_is_401_and_not_kept(api: Api) -> None:
    status, _, answer = api.call(webhook_event(b"{", {"webhook-id": "x"}))
    assert (status, answer["error"]) == (401, "invalid-signature")
    assert api.quarantine.all() == []


def test_invalid_base64_is_400(api: Api) -> None:
    event = webhook_event(b"{}", signed_headers(b"{}"), base64_encoded=True)
    event["body"] = "!!!not base64!!!"
    status, _, answer = api.call(event)
    assert (status, answer["error"]) == (400, "invalid-body")
    assert api.store.all() == []


@pytest.mark.parametrize(
    "headers",
    [
        signed_headers(webhook_body(), secrets=(OTHER_SECRET,)),
        {},
        {"webhook-id": "x", "webhook-timestamp": str(EVENT_TIMESTAMP)},
        signed_headers(webhook_body(), timestamp=EVENT_TIMESTAMP - 301),
        signed_headers(webhook_body(), timestamp=EVENT_TIMESTAMP + 301),
    ],
    ids=["wrong secret", "no headers", "no signature", "301 s old", "301 s ahead"],
)
def test_bad_signature_is_401_and_writes_nothing(
    api: Api, headers: dict[str, str], buffered_metrics: dict[str, Any]
) -> None:
    status, _, answer = api.call(webhook_event(webhook_body(), headers))
    assert status == 401
    assert answer == {"error": "invalid-signature", "message": "invalid signature"}
    assert api.store.all() == []
    assert buffered_metrics["SignatureRejected"]["Value"] == [1.0]


def test_signature_is_checked_before_the_body_is_parsed(api: Api) -> None:
    body = b"{not json"
    status, _, answer = api.call(webhook_event(body, signed_headers(body, secrets=(OTHER_SECRET,))))
    assert (status, answer["error"]) == (401, "invalid-signature")


class SpyVerifier:
    def __init__(self) -> None:
        self.calls = 0

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        self.calls += 1


@pytest.mark.parametrize("base64_encoded", [False, True])
def test_413_is_decided_before_any_signature_work(base64_encoded: bool) -> None:
    spy = SpyVerifier()
    api = Api(MemoryStore(), settings=Settings(max_body_bytes=1000), verifier=spy)
    at_limit = webhook_body(user_metadata={"pad": ""})
    at_limit = webhook_body(user_metadata={"pad": "x" * (1000 - len(at_limit))})
    assert len(at_limit) == 1000
    status, _, _ = api.call(webhook_event(at_limit, {}, base64_encoded=base64_encoded))
    assert status == 200
    assert spy.calls == 1
    over = at_limit.replace(b'"x', b'"xx')
    status, _, answer = api.call(webhook_event(over, {}, base64_encoded=base64_encoded))
    assert (status, answer["error"]) == (413, "payload-too-large")
    assert spy.calls == 1
    # A huge base64 body is refused on its encoded length, without being decoded.
    event = webhook_event(b"{}", {}, base64_encoded=True)
    event["body"] = "A" * 10_000_000
    status, _, _ = api.call(event)
    assert status == 413
    assert spy.calls == 1


def test_multibyte_text_counts_bytes_not_characters() -> None:
    api = Api(MemoryStore(), settings=Settings(max_body_bytes=1000), verifier=SpyVerifier())
    doc = {"type": "batch.succeeded", "data": {"id": "batches/b1", "pad": "é" * 480}}
    body = json.dumps(doc, ensure_ascii=False).encode()  # each "é" is 1 character, 2 bytes
    assert len(body.decode()) < 1000 < len(body)
    status, _, _ = api.call(webhook_event(body, {}))
    assert status == 413


# --- 503: never acknowledge an event that was neither applied nor dropped ------------------------


class LosingStore(MemoryStore):
    """Every conditional write loses to a (newer-version, older-state) concurrent writer."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def _rival(self, name: str) -> OpRecord:
        self.writes += 1
        return OpRecord(name, State.RUNNING, self.writes, self.writes, "poll")

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        return WriteOutcome(ok=False, current=self._rival(record.name))

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        return WriteOutcome(ok=False, current=self._rival(record.name))


class DownStore(MemoryStore):
    def get(self, name: str) -> OpRecord | None:
        raise StoreUnavailableError("throttled")


def test_store_that_always_loses_is_503_with_retry_after(
    buffered_metrics: dict[str, Any],
) -> None:
    api = Api(LosingStore())
    status, headers, answer = api.webhook(webhook_body())
    assert status == 503
    assert answer["error"] == "retry-later"
    assert int(headers["retry-after"]) >= 1
    assert api.store.writes == api.settings.ingest_max_attempts
    assert api.decisions == []
    assert buffered_metrics["IngestGaveUp"]["Value"] == [1.0]
    report = compact({"state": "SUCCEEDED"})
    status, headers, _ = api.call(operation_event("PUT", "batches/b1", report))
    assert status == 503 and "retry-after" in headers


@pytest.mark.parametrize(
    "event",
    [
        webhook_event(webhook_body(), signed_headers(webhook_body())),
        operation_event("PUT", "batches/b1"),
        operation_event("GET", "batches/b1"),
    ],
    ids=["webhook", "put", "get"],
)
def test_unavailable_store_is_503(event: dict[str, Any]) -> None:
    status, headers, answer = Api(DownStore()).call(event)
    assert (status, answer["error"]) == (503, "unavailable")
    assert int(headers["retry-after"]) >= 1


def test_unreadable_secrets_are_503_not_401() -> None:
    class Unavailable:
        def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
            raise SecretsUnavailableError("secrets manager timed out")

    api = Api(MemoryStore(), verifier=Unavailable())
    status, headers, answer = api.webhook(webhook_body())
    assert (status, answer["error"]) == (503, "unavailable")
    assert "retry-after" in headers


# --- PUT /operations/{name+} ---------------------------------------------------------------------


def test_put_without_body_tracks_the_job_as_pending_now(api: Api) -> None:
    status, _, answer = api.call(operation_event("PUT", "batches/new-1"))
    assert status == 200
    assert answer == {
        "applied": True,
        "reason": "created",
        "name": "batches/new-1",
        "state": "PENDING",
        "version": 1,
    }
    record = api.store.get("batches/new-1")
    assert record.update_time_ns == NOW_NS
    assert record.source == "report"


@pytest.mark.parametrize("body", [None, {"state": "SUCCEEDED"}, {"retry": {"maxAttempts": 1}}])
def test_put_of_a_job_name_is_refused_and_writes_nothing(api: Api, body: Any) -> None:
    # A job (issue 46) is opstate's own: no report may create one, end one or attach a policy
    # that would feed parts (THREATS.md, actor a).
    raw = None if body is None else json.dumps(body).encode()
    status, _, answer = api.call(operation_event("PUT", "jobs/0123456789abcdef01234567", raw))
    assert status == 400 and answer["error"] == "invalid-name"
    assert api.store.get("jobs/0123456789abcdef01234567") is None


def test_put_report_then_stale_report(api: Api) -> None:
    running = compact({"state": "running", "updateTime": "2026-05-10T09:00:00+09:00"})
    status, _, answer = api.call(operation_event("PUT", "batches/r1", running))
    assert (status, answer["state"], answer["version"]) == (200, "RUNNING", 1)
    stale = compact({"state": "RUNNING", "updateTime": "2026-05-09T23:59:59Z"})
    status, _, answer = api.call(operation_event("PUT", "batches/r1", stale))
    assert (status, answer["applied"], answer["reason"]) == (
        200,
        False,
        "stale-or-equal-update-time",
    )
    done = compact({"state": "SUCCEEDED", "details": {"rows": 10}})
    status, _, answer = api.call(operation_event("PUT", "batches/r1", done))
    assert (answer["applied"], answer["state"], answer["version"]) == (True, "SUCCEEDED", 2)
    assert api.store.get("batches/r1").details == {"rows": 10}


def test_put_name_with_slashes_and_whitespace_body(api: Api) -> None:
    name = "models/veo-3.1-generate-preview/operations/op-9"
    status, _, answer = api.call(operation_event("PUT", name, b"  \n"))
    assert (status, answer["name"], answer["state"]) == (200, "models/-/operations/op-9", "PENDING")


# (case id, path name, body, expected error code)
BAD_REPORTS: list[tuple[str, str, bytes | None, str]] = [
    ("unknown state", "batches/p1", compact({"state": "PAUSED_FOREVER"}), "invalid-state"),
    ("state not a string", "batches/p1", compact({"state": 3}), "invalid-state"),
    ("unparseable time", "batches/p1", compact({"updateTime": "soon"}), "invalid-time"),
    ("details not an object", "batches/p1", compact({"details": [1]}), "invalid-details"),
    ("body a list", "batches/p1", b"[]", "invalid-body"),
    ("body a number", "batches/p1", b"12", "invalid-body"),
    ("malformed JSON", "batches/p1", b"{", "malformed-json"),
    ("bare id", "p1", None, "invalid-name"),
    ("bad characters", "batches/p%20q", None, "invalid-name"),
    ("dot-dot", "batches/..", None, "invalid-name"),
]


@pytest.mark.parametrize(
    ("name", "body", "code"), [c[1:] for c in BAD_REPORTS], ids=[c[0] for c in BAD_REPORTS]
)
def test_bad_reports_are_400_and_write_nothing(
    api: Api, name: str, body: bytes | None, code: str
) -> None:
    status, _, answer = api.call(operation_event("PUT", name, body))
    assert (status, answer["error"]) == (400, code)
    assert answer["message"]
    assert api.store.all() == []


# --- GET /operations/{name+} ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling",
    [
        "batches/g1",
        "v1beta/batches/g1",
        "v1/batches/g1",
        "batches/g1:cancel",
        "batches%2Fg1",
        "https%3A%2F%2Fgenerativelanguage.googleapis.com%2Fv1beta%2Fbatches%2Fg1",
    ],
)
def test_get_finds_the_record_under_any_spelling(api: Api, spelling: str) -> None:
    api.webhook(webhook_body(id="batches/g1"))
    status, _, record = api.call(operation_event("GET", spelling))
    assert status == 200
    assert record["name"] == "batches/g1"
    assert record["state"] == "SUCCEEDED"
    assert record["version"] == 1
    assert set(record) == {
        "name",
        "kind",
        "backend",
        "state",
        "updateTime",
        "version",
        "source",
        "details",
        "createdAt",
        "appliedAt",
    }
    assert record["updateTime"] == "2026-05-10T09:59:00.000000000Z"


def test_get_long_operation_name(api: Api) -> None:
    name = "fileSearchStores/s1/operations/o1"
    api.call(operation_event("PUT", name, compact({"state": "RUNNING"})))
    status, _, record = api.call(operation_event("GET", name))
    assert (status, record["kind"], record["state"]) == (200, "file_search_import", "RUNNING")


def test_get_unknown_is_404_and_bad_name_400(api: Api) -> None:
    status, _, answer = api.call(operation_event("GET", "batches/nope"))
    assert (status, answer["error"]) == (404, "not-found")
    status, _, answer = api.call(operation_event("GET", "nope"))
    assert (status, answer["error"]) == (400, "invalid-name")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("GET", "/gemini/webhook"),
        ("DELETE", "/operations/batches/b1"),
        ("POST", "/operations/batches/b1"),
        ("GET", "/operations/"),
        ("POST", "/gemini/webhook/extra"),
    ],
)
def test_unknown_routes_are_404_json(api: Api, method: str, path: str) -> None:
    status, _, answer = api.call(http_event(method, path))
    assert (status, answer["error"]) == (404, "not-found")


# --- observability -------------------------------------------------------------------------------


def test_decision_log_line_has_the_fields_and_no_secret_signature_or_body(
    api: Api, capsys: pytest.CaptureFixture[str], logs: Callable[[], str]
) -> None:
    body = webhook_body(output_file_uri="files/very-private-output-uri")
    headers = signed_headers(body, msg_id="msg_logcheck")
    api.call(webhook_event(body, headers))
    api.call(webhook_event(body, signed_headers(body, secrets=(OTHER_SECRET,))))
    out = capsys.readouterr().out + logs()
    lines = parse_lines(out)
    decision = next(x for x in lines if x.get("message") == "event applied")
    assert decision["name"] == "batches/b1"
    assert decision["state"] == "SUCCEEDED"
    assert decision["reason"] == "created"
    assert decision["version"] == 1
    assert decision["source"] == "webhook"
    assert decision["webhook_id"] == "msg_logcheck"
    metric = next(x for x in lines if "EventsApplied" in x)
    assert metric["reason"] == "created"
    for secret in (TEST_SECRET, OTHER_SECRET, TEST_SECRET.removeprefix("whsec_")):
        assert secret not in out
    assert headers["webhook-signature"].removeprefix("v1,") not in out
    assert "very-private-output-uri" not in out
    assert any(x.get("message") == "webhook signature rejected" for x in lines)


def test_on_decision_failure_does_not_fail_the_request() -> None:
    def boom(decision: Decision) -> None:
        raise RuntimeError("printer broke")

    app = create_app(
        store=MemoryStore(), verifier=verifier(), settings=Settings(), on_decision=boom
    )
    body = webhook_body()
    response = app.resolve(webhook_event(body, signed_headers(body)), None)  # type: ignore[arg-type]
    assert response["statusCode"] == 200


def test_concurrent_requests_are_not_mixed_up() -> None:
    store = MemoryStore()
    apps = [
        create_app(store=store, verifier=verifier(), settings=Settings(), clock_ns=lambda: NOW_NS)
        for _ in range(2)
    ]
    results: dict[str, Any] = {}

    def worker(i: int) -> None:
        name = f"batches/c{i}"
        response = apps[i % 2].resolve(operation_event("PUT", name), None)  # type: ignore[arg-type]
        results[name] = json.loads(response["body"])["name"]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {f"batches/c{i}": f"batches/c{i}" for i in range(16)}
    assert len(store.all()) == 16


def test_get_shows_results_and_progress_when_known(api: Api) -> None:
    from opstate.store.port import ArchiveState

    api.call(operation_event("PUT", "batches/r1", compact({"state": "RUNNING"})))
    _, _, running = api.call(operation_event("GET", "batches/r1"))
    assert "results" not in running and "progress" not in running  # not known yet
    stats = {"requestCount": 10, "successfulRequestCount": 4, "pendingRequestCount": 6}
    body = {"state": "SUCCEEDED", "details": {"batch_stats": stats}}
    api.call(operation_event("PUT", "batches/r1", compact(body)))
    record = api.store.get("batches/r1")
    archive = ArchiveState(
        "archived",
        created_ns=record.created_ns,
        deadline_ns=NOW_NS + 10**9,
        location="s3://b/p/batches/r1/1/summary.json",
    )
    assert api.store.set_archive("batches/r1", 0, archive)
    status, _, view = api.call(operation_event("GET", "batches/r1"))
    assert status == 200 and view["progress"] == stats
    assert view["results"] == {
        "status": "archived",
        "expiresAt": "2026-05-10T10:00:01.000000000Z",
        "location": "s3://b/p/batches/r1/1/summary.json",
    }
    assert view["version"] == record.version
