"""The saved Logs Insights queries find what the code really logs.

The webhook API (``create_app``) and the reconciler (the real google-genai client against the
fake Gemini server) run through applied, dropped, rejected and not-acknowledged events while the
Powertools logger's JSON lines are captured at INFO (the functions' level). Each query of the
template's generated block is then run over those lines (``tests/support/insights.py``). A
renamed log field or message breaks these tests, not the deployed queries.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

import scripts.observability_block as generator
from opstate.api import create_app
from opstate.config import Settings
from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.observability import SERVICE, logger
from opstate.reconcile import Backoff, GenaiGateway, make_client, reconcile_once
from opstate.signatures import StaticSecretsVerifier
from opstate.store import MemoryStore
from opstate.store.port import StoreUnavailableError, WriteOutcome
from tests.support.fake_gemini import FakeGemini
from tests.support.insights import parse_filter, referenced_fields, run_query
from tests.support.webhooks import (
    EVENT_TIMESTAMP,
    OTHER_SECRET,
    TEST_SECRET,
    compact,
    operation_event,
    signed_headers,
    webhook_event,
)

NAME = "batches/q1"
POLLED = "batches/q2"
API_KEY = "test-key"
QUERIES = {q.title: q.text for q in generator.QUERIES}


class _LosingStore(MemoryStore):
    """Every conditional write loses to a concurrent writer: ingest gives up (503)."""

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        return WriteOutcome(False, OpRecord(record.name, State.RUNNING, 1, 1, "poll"))

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        return WriteOutcome(False, OpRecord(record.name, State.RUNNING, 1, 1, "poll"))


class _DownStore(MemoryStore):
    def get(self, name: str) -> OpRecord | None:
        raise StoreUnavailableError("table unreachable")


def _webhook(event_type: str, name: str = NAME, when: str = "2026-05-10T09:59:00Z") -> bytes:
    return compact({"type": event_type, "timestamp": when, "data": {"id": name}})


@pytest.fixture(scope="module")
def lines() -> Iterator[list[dict[str, Any]]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logger.registered_formatter)
    std = logging.getLogger(SERVICE)
    std.addHandler(handler)
    level = logger.log_level
    logger.setLevel("INFO")
    try:
        _webhook_traffic()
        _reconcile_traffic()
    finally:
        logger.setLevel(level)
        std.removeHandler(handler)
    yield [json.loads(x) for x in stream.getvalue().splitlines() if x.startswith("{")]


def _webhook_traffic() -> None:
    verifier = StaticSecretsVerifier((TEST_SECRET,), clock_s=lambda: EVENT_TIMESTAMP)
    settings = Settings(ingest_max_attempts=2)
    app = create_app(store=MemoryStore(), verifier=verifier, settings=settings)

    def send(target: Any, body: bytes, secret: str = TEST_SECRET) -> int:
        event = webhook_event(body, signed_headers(body, secrets=(secret,)))
        return int(target.resolve(event, None)["statusCode"])

    report = compact({"state": "RUNNING", "updateTime": "2026-05-10T09:00:00Z"})
    statuses = [
        send(app, _webhook("batch.succeeded")),  # created
        send(app, _webhook("batch.succeeded")),  # the stale redelivery
        send(app, _webhook("batch.failed")),  # terminal-conflict
        int(app.resolve(operation_event("PUT", NAME, report), None)["statusCode"]),  # regress
        send(app, _webhook("batch.paused")),  # unsupported-event-type
        send(app, _webhook("batch.succeeded"), OTHER_SECRET),  # signature rejected
        send(
            create_app(store=_DownStore(), verifier=verifier, settings=settings),
            _webhook("batch.succeeded", "batches/down"),
        ),
        send(
            create_app(store=_LosingStore(), verifier=verifier, settings=settings),
            _webhook("batch.succeeded", "batches/busy"),
        ),
    ]
    assert statuses == [200, 200, 200, 200, 200, 401, 503, 503]


def _reconcile_traffic() -> None:
    settings = Settings(
        store_url="memory://",
        gemini_api_key=API_KEY,
        reconcile_workers=2,
        reconcile_max_pages=0,
        reconcile_http_timeout_s=2.0,
    )
    store = MemoryStore()
    store.put_if_absent(
        OpRecord(POLLED, State.RUNNING, parse_time("2026-05-10T08:00:00Z"), 1, "report")
    )
    with FakeGemini() as fake, pytest.MonkeyPatch.context() as patch:
        fake.api_key = API_KEY
        fake.put_batch(POLLED, "BATCH_STATE_SUCCEEDED", update_time="2026-05-10T09:30:00Z")
        patch.setenv("GOOGLE_GEMINI_BASE_URL", fake.base_url)
        client = make_client(settings)
        try:
            fast = Backoff(base_s=0.01, max_s=0.05)
            gateway = GenaiGateway(client)
            reconcile_once(store, gateway, settings=settings, backoff=fast)

            class FlakyStore(MemoryStore):
                """Lists the operation as due, then cannot write its answer."""

                def replace_if_version(
                    self, record: OpRecord, expected_version: int
                ) -> WriteOutcome:
                    raise StoreUnavailableError("table unreachable")

            flaky = FlakyStore()
            flaky.put_if_absent(replace(store.get(POLLED) or _missing(), state=State.RUNNING))
            reconcile_once(flaky, gateway, settings=settings, backoff=fast)
        finally:
            client.close()


def _missing() -> OpRecord:
    raise AssertionError(f"{POLLED} was not stored")


def test_every_decision_for_one_operation(lines: list[dict[str, Any]]) -> None:
    query = QUERIES["every decision for one operation"]
    assert generator.OPERATION_PLACEHOLDER in query
    rows = run_query(query.replace(generator.OPERATION_PLACEHOLDER, NAME), lines)
    # The stale redelivery and the regressing report are not lines (issue 48: a drop of a
    # state the table already holds is counted, EventsDropped by reason).
    assert [(r["applied"], r["reason"], r["source"]) for r in rows] == [
        (True, "created", "webhook"),
        (False, "terminal-conflict", "webhook"),
        (False, "unsupported-event-type", "webhook"),  # refused before the reducer
    ]
    first = rows[0]
    assert first["update_time"] == "2026-05-10T09:59:00.000000000Z"
    assert (first["version"], first["state"], first["webhook_id"]) == (
        1,
        "SUCCEEDED",
        "msg_2abc0sample",
    )
    assert rows[1]["version"] == 1  # a drop reports the stored version
    assert rows[1]["update_time"] == "2026-05-10T09:59:00.000000000Z"

    polled = run_query(query.replace(generator.OPERATION_PLACEHOLDER, POLLED), lines)
    assert [(r["applied"], r["reason"], r["source"], r["phase"]) for r in polled] == [
        (True, "advanced", "poll", "poll")
    ]
    assert polled[0]["update_time"] == "2026-05-10T09:30:00.000000000Z"


def test_drops_by_reason(lines: list[dict[str, Any]]) -> None:
    rows = run_query(QUERIES["drops by reason"], lines)
    counts = {(r["reason"], r["source"]): r["drops"] for r in rows}
    assert counts == {  # the drops an operator acts on; the others are counted, not logged
        ("terminal-conflict", "webhook"): 1,
        ("unsupported-event-type", "webhook"): 1,
    }


def test_signature_rejections(lines: list[dict[str, Any]]) -> None:
    rows = run_query(QUERIES["signature rejections"], lines)
    assert [r["webhook_id"] for r in rows] == ["msg_2abc0sample"]


def test_503s_and_give_ups(lines: list[dict[str, Any]]) -> None:
    rows = run_query(QUERIES["503s and give-ups"], lines)
    found = sorted((r["retry"], r["name"], r["phase"]) for r in rows)
    assert found == [
        ("gave-up", "batches/busy", None),
        ("unavailable", "batches/down", None),
        ("unavailable", POLLED, "poll"),
    ]
    assert all(r["error"] for r in rows)


def test_every_field_a_query_names_is_one_the_code_writes(lines: list[dict[str, Any]]) -> None:
    written = {key for line in lines for key in line}
    for title, query in QUERIES.items():
        missing = referenced_fields(query) - written
        assert not missing, f"{title!r} names fields no log line has: {missing}"


def test_the_evaluator_is_strict_about_what_it_does_not_know() -> None:
    from tests.support.insights import QueryError

    assert parse_filter('a = "x" and (b != 2 or not ispresent(c))')({"a": "x", "b": 2})
    assert not parse_filter('a in ["y", "z"]')({"a": "x"})
    assert parse_filter("a like /^ev.*ed$/")({"a": "event applied"})
    with pytest.raises(QueryError):
        parse_filter("a > 3")
    with pytest.raises(QueryError):
        run_query("parse @message 'x'", [])
