"""Lost and overdue operations reach the bus through the outbox (moto, in process).

The reconciler runs on a ``DynamoDBStore`` (template table, stream on) with an in-memory
gateway and a fake clock; the table's stream goes through the notifier to the custom bus and a
consumer queue, as in test_notify.py (whose harness this reuses).
"""

from __future__ import annotations

import json

from opstate.config import Settings
from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.notify import LOST_DETAIL_TYPE, OVERDUE_DETAIL_TYPE, SOURCE, Notifier
from opstate.reconcile.run import reconcile_once
from tests.integration.test_notify import Rig, lambda_event, rig
from tests.support.clock import FakeClock
from tests.support.gemini_memory import MemoryGateway

__all__ = ["rig"]  # the fixture

S = 1_000_000_000
HOUR = 3600 * S
T0 = 1_767_225_600 * S
SETTINGS = Settings(
    store_url="memory://",
    reconcile_workers=1,
    reconcile_max_pages=0,
    reconcile_overdue_hours="batch=24",
)


def subscribe_marks(rig: Rig) -> None:
    queue_arn = rig.sqs.get_queue_attributes(QueueUrl=rig.queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    rig.events.put_rule(
        Name="marks",
        EventBusName=rig.bus,
        EventPattern=json.dumps(
            {"source": [SOURCE], "detail-type": [LOST_DETAIL_TYPE, OVERDUE_DETAIL_TYPE]}
        ),
    )
    rig.events.put_targets(
        Rule="marks", EventBusName=rig.bus, Targets=[{"Id": "marks", "Arn": queue_arn}]
    )


def test_lost_and_overdue_operations_are_announced_once_on_the_bus(rig: Rig) -> None:
    subscribe_marks(rig)
    store = rig.store
    clock = FakeClock(T0)
    gateway = MemoryGateway()
    created = T0 - 23 * HOUR
    for name in ("batches/slow", "batches/gone"):
        ingest(store, OpEvent(name, State.RUNNING, created, "report", {}), clock_ns=lambda: created)
    gateway.put("batches/slow", State.RUNNING, created)
    gateway.remove("batches/gone")
    notifier = Notifier(rig.bus, rig.events)
    for _ in range(30):  # 30 hours of hourly runs
        reconcile_once(store, gateway, settings=SETTINGS, clock=clock)
        records = rig.read_stream()
        if records:
            response = notifier.handle(lambda_event(records))
            assert response["batchItemFailures"] == []
        clock.advance(3600)
    events = [e for e in rig.receive() if e["detail-type"] != "Operation State Changed"]
    kinds = sorted((e["detail-type"], e["detail"]["name"]) for e in events)
    assert kinds == [
        (LOST_DETAIL_TYPE, "batches/gone"),
        (OVERDUE_DETAIL_TYPE, "batches/gone"),
        (OVERDUE_DETAIL_TYPE, "batches/slow"),
    ]
    lost = next(e["detail"] for e in events if e["detail-type"] == LOST_DETAIL_TYPE)
    assert lost["state"] == "RUNNING"
    assert lost["idempotencyKey"].startswith("batches/gone#lost#")
    assert lost["notFoundCount"] >= 3 and lost["lostAt"] and lost["notFoundSince"]
    overdue = next(
        e["detail"]
        for e in events
        if e["detail-type"] == OVERDUE_DETAIL_TYPE and e["detail"]["name"] == "batches/slow"
    )
    assert overdue["idempotencyKey"] == "batches/slow#overdue"
    assert overdue["openSince"] == "2025-12-31T01:00:00.000000000Z"
