"""The API and the reconciler log and count a decision by one rule (``log_decision``), with what
ingest reported beside it: its attempts and the conditional writes it lost (``IngestConflicts``).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from opstate.api import create_app
from opstate.config import Settings
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.ingest import ingest
from opstate.observability import SERVICE, logger, metrics
from opstate.reconcile.run import reconcile_once
from opstate.signatures import StaticSecretsVerifier
from opstate.store import MemoryStore
from opstate.store.port import WriteOutcome
from tests.support.clock import FakeClock
from tests.support.gemini_memory import MemoryGateway
from tests.support.webhooks import (
    EVENT_TIMESTAMP,
    TEST_SECRET,
    compact,
    signed_headers,
    webhook_event,
)

NAME = "batches/d1"
NOW_NS = parse_time("2026-05-10T10:00:00Z")
T0 = parse_time("2026-05-10T09:00:00Z")
SETTINGS = Settings(
    store_url="memory://",
    reconcile_workers=1,
    reconcile_max_pages=0,
    reconcile_max_rps=0,
    reconcile_safety_margin_s=10.0,
)


class RacingStore(MemoryStore):
    """Before each of the first ``losses`` conditional writes, a rival writes first: a newer
    RUNNING record, which the losing write hands back."""

    def __init__(self, losses: int) -> None:
        super().__init__()
        self.losses = losses

    def _rival_wins(self, name: str) -> WriteOutcome | None:
        if self.losses <= 0:
            return None
        self.losses -= 1
        current = self.get(name)
        if current is None:
            rival = OpRecord(name, State.RUNNING, T0, 1, "poll")
            assert super().put_if_absent(rival).ok
        else:
            rival = replace(current, update_time_ns=current.update_time_ns + 1)
            rival = replace(rival, version=current.version + 1, state=State.RUNNING)
            assert super().replace_if_version(rival, current.version).ok
        return WriteOutcome(ok=False, current=rival)

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        return self._rival_wins(record.name) or super().put_if_absent(record)

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        return self._rival_wins(record.name) or super().replace_if_version(record, expected_version)


def decision_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [
        line
        for line in (json.loads(x) for x in stream.getvalue().splitlines() if x.startswith("{"))
        if line.get("message") in ("event applied", "event dropped")
    ]


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The Powertools logger's JSON lines at INFO (the functions' level), metrics cleared."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logger.registered_formatter)
    std = logging.getLogger(SERVICE)
    std.addHandler(handler)
    level = logger.log_level
    logger.setLevel("INFO")
    metrics.clear_metrics()
    try:
        yield stream
    finally:
        logger.setLevel(level)
        std.removeHandler(handler)
        metrics.clear_metrics()


def conflicts_metric() -> list[float]:
    entry = metrics.metric_set.get("IngestConflicts")
    return list(entry["Value"]) if entry else []


def send(store: MemoryStore, event_type: str, when: str) -> int:
    verifier = StaticSecretsVerifier((TEST_SECRET,), clock_s=lambda: EVENT_TIMESTAMP)
    app = create_app(store=store, verifier=verifier, settings=SETTINGS, clock_ns=lambda: NOW_NS)
    body = compact({"type": event_type, "timestamp": when, "data": {"id": NAME}})
    response = app.resolve(webhook_event(body, signed_headers(body)), None)  # type: ignore[arg-type]
    return int(response["statusCode"])


def reconcile(store: MemoryStore, gateway: MemoryGateway, settings: Settings = SETTINGS) -> None:
    reconcile_once(store, gateway, settings=settings, clock=FakeClock(NOW_NS))


def test_api_logs_and_counts_the_races_ingest_lost(captured: io.StringIO) -> None:
    store = RacingStore(losses=2)
    assert send(store, "batch.succeeded", "2026-05-10T09:59:00Z") == 200
    [line] = decision_lines(captured)
    assert (line["message"], line["reason"], line["level"]) == ("event applied", "advanced", "INFO")
    assert (line["attempts"], line["conflicts"]) == (3, 2)
    assert conflicts_metric() == [2.0]


def test_reconciler_logs_and_counts_the_races_ingest_lost(captured: io.StringIO) -> None:
    store = RacingStore(losses=0)
    ingest(store, OpEvent(NAME, State.RUNNING, T0, "report", {}), clock_ns=lambda: T0)
    gateway = MemoryGateway()
    gateway.put(NAME, State.SUCCEEDED, T0 + 10**9)
    store.losses = 1
    reconcile(store, gateway)
    [line] = decision_lines(captured)
    assert (line["message"], line["reason"], line["phase"]) == ("event applied", "advanced", "poll")
    assert (line["attempts"], line["conflicts"]) == (2, 1)
    assert conflicts_metric() == [1.0]
    record = store.get(NAME)
    assert record is not None and record.state is State.SUCCEEDED


def test_no_lost_race_is_no_conflicts_metric(captured: io.StringIO) -> None:
    assert send(MemoryStore(), "batch.succeeded", "2026-05-10T09:59:00Z") == 200
    [line] = decision_lines(captured)
    assert (line["attempts"], line["conflicts"]) == (1, 0)
    assert conflicts_metric() == []


def test_api_and_reconciler_log_drops_at_one_level(captured: io.StringIO) -> None:
    """A state change: INFO. A terminal conflict: WARNING. A drop of a state the table already
    holds: no line at INFO (issue 48: counted, below). Both entries."""
    api_store = MemoryStore()
    send(api_store, "batch.succeeded", "2026-05-10T09:59:00Z")  # created
    send(api_store, "batch.succeeded", "2026-05-10T09:59:00Z")  # the stale redelivery
    send(api_store, "batch.failed", "2026-05-10T09:59:30Z")  # terminal-conflict

    store = MemoryStore()
    done, running = "batches/done", "batches/running"
    ingest(store, OpEvent(done, State.SUCCEEDED, T0, "webhook", {}), clock_ns=lambda: T0)
    ingest(store, OpEvent(running, State.RUNNING, T0, "report", {}), clock_ns=lambda: T0)
    gateway = MemoryGateway()
    gateway.put(done, State.FAILED, T0 + 10**9)  # discovery: a terminal conflict
    gateway.put(running, State.RUNNING, T0)  # polled: unchanged, a stale drop
    gateway.batch_list = [done]
    reconcile(store, gateway, replace(SETTINGS, reconcile_max_pages=1))

    seen = {(x.get("phase", "api"), x["reason"], x["level"]) for x in decision_lines(captured)}
    assert seen == {
        ("api", "created", "INFO"),
        ("api", "terminal-conflict", "WARNING"),
        ("discover", "terminal-conflict", "WARNING"),
    }


def test_a_drop_of_a_state_the_table_holds_is_a_count_and_a_debug_line(
    captured: io.StringIO, capsys: pytest.CaptureFixture[str]
) -> None:
    store = MemoryStore()
    send(store, "batch.succeeded", "2026-05-10T09:59:00Z")  # created
    capsys.readouterr()
    send(store, "batch.succeeded", "2026-05-10T09:59:00Z")  # the redelivery: already held
    assert [x["reason"] for x in decision_lines(captured)] == ["created"]
    [blob] = [
        json.loads(x)
        for x in capsys.readouterr().out.splitlines()
        if '"EventsDropped"' in x and x.startswith("{")
    ]
    assert blob["reason"] == "stale-or-equal-update-time" and blob["EventsDropped"] == [1.0]
    logger.setLevel("DEBUG")  # an operator who wants every decision still gets the line
    send(store, "batch.succeeded", "2026-05-10T09:59:00Z")
    assert [(x["reason"], x["level"]) for x in decision_lines(captured)][1:] == [
        ("stale-or-equal-update-time", "DEBUG")
    ]
