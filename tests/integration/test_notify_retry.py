"""The retry engine's writes reach the bus through the outbox (moto, in process; issue 33).

A root's retry slot is written by the DynamoDB store's ``set_retry``: an ``UpdateItem`` of its
own setting ``retry`` (``{status, created_ns, rev, due_ns, doc}``) and ``retry_status`` /
``retry_rev`` / ``retry_due_ns``, never the record's own attributes. The
table's stream goes through the real notifier onto the moto bus (test_notify.py's harness);
``Rig.receive`` checks every detail against its JSON Schema.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import pytest
from boto3.dynamodb.types import TypeSerializer

from opstate.domain.costs import REASON_FINAL_PREVIOUS_RELEASE
from opstate.domain.states import State
from opstate.notify import (
    DETAIL_TYPE,
    RESULTS_FINAL_DETAIL_TYPE,
    RETRY_SUBMITTED_DETAIL_TYPE,
    SOURCE,
    InvalidStreamRecordError,
    Notifier,
    build_entry,
)
from opstate.store.dynamodb import item_from_record, serialize_item
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RetryState
from tests.integration.test_notify import T0, Rig, lambda_event, rig
from tests.support.event_schemas import problems, schema_file

__all__ = ["rig"]  # the fixture

ROOT = "batches/root"
FINAL_URI = "s3://results/r/batches/root/final.jsonl"


def child_id(created_ns: int, attempt: int, index: int) -> str:
    h12 = hashlib.sha256(f"{ROOT}@{created_ns}".encode()).hexdigest()[:12]
    return f"opstate-{h12}-a{attempt}-{index}"


def child(created_ns: int, attempt: int, index: int, phase: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": child_id(created_ns, attempt, index),
        "attempt": attempt,
        "parent": ROOT if attempt == 1 else f"batches/a{attempt - 1}",
        "name": f"batches/a{attempt}-{index}" if phase == "created" else None,
        "rows": 10 + index,
        "input": f"s3://results/r/retry/{child_id(created_ns, attempt, index)}.jsonl",
        "whole": False,
        "phase": phase,
        "claims": 0,
        "claimUntilNs": 0,
        "error": None,
        **extra,
    }


def root_doc(children: list[dict[str, Any]], final: str = "pending") -> dict[str, Any]:
    return {
        "policy": {"maxAttempts": 2, "resubmitExpired": False, "pendingTimeoutHours": None},
        "model": "models/gemini-2.5-flash",
        "input": {"source": None, "location": None, "sha256": None, "rows": 100, "bytes": 900},
        "unavailable": None,
        "stopped": None,
        "children": children,
        "cancelled": [],
        "final": {
            "status": final,
            "location": FINAL_URI if final == "final" else None,
            "rows": {"total": 100, "answered": 97, "blocked": 2, "failed": 3},
            "errors": {"400": 2, "503": 1},
            "retried": 12,
            "attempts": 3,
        },
    }


class Slot:
    """The retry slot of one item, written by the store's ``set_retry`` (its own conditional
    ``UpdateItem``, as the retry engine writes it)."""

    def __init__(self, rig: Rig, name: str) -> None:
        record = rig.store.get(name)
        assert record is not None
        self.rig, self.name, self.created_ns, self.rev = rig, name, record.created_ns, 0

    def write(self, doc: Mapping[str, Any], status: str = RETRY_ACTIVE) -> None:
        state = RetryState(status, self.created_ns, 0, T0, doc)
        assert self.rig.store.set_retry(self.name, self.rev, state)
        self.rev += 1


def subscribe_all(rig: Rig) -> None:
    """The retry events too (the fixture's rule forwards the state changes)."""
    queue_arn = rig.sqs.get_queue_attributes(QueueUrl=rig.queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    rig.events.put_rule(
        Name="retries",
        EventBusName=rig.bus,
        EventPattern=json.dumps(
            {
                "source": [SOURCE],
                "detail-type": [RETRY_SUBMITTED_DETAIL_TYPE, RESULTS_FINAL_DETAIL_TYPE],
            }
        ),
    )
    rig.events.put_targets(
        Rule="retries", EventBusName=rig.bus, Targets=[{"Id": "retries", "Arn": queue_arn}]
    )


def publish(rig: Rig) -> list[tuple[str, dict[str, Any]]]:
    """Hand the stream written since the last call to the notifier; what the bus delivered."""
    records = rig.read_stream()
    if records:
        response = Notifier(rig.bus, rig.events).handle(lambda_event(records))
        assert response["batchItemFailures"] == []
    return [(e["detail-type"], e["detail"]) for e in rig.receive()]


def test_each_created_child_and_the_final_result_are_announced_once(rig: Rig) -> None:
    subscribe_all(rig)
    rig.ingest(ROOT, State.SUCCEEDED, 1)
    assert [t for t, _ in publish(rig)] == [DETAIL_TYPE]
    slot = Slot(rig, ROOT)
    created_ns = slot.created_ns
    a1 = [child(created_ns, 1, 0, "planned"), child(created_ns, 1, 1, "planned")]
    slot.write(root_doc([]))  # the slot's first write: the old image has no retry slot
    slot.write(root_doc(a1))  # planned
    a1[0] = child(created_ns, 1, 0, "creating", claims=1, claimUntilNs=T0)
    slot.write(root_doc(a1))
    assert publish(rig) == []
    a1[0] = child(created_ns, 1, 0, "created")
    slot.write(root_doc(a1))
    a1[1] = child(created_ns, 1, 1, "created")
    slot.write(root_doc(a1))
    slot.write(root_doc(a1))  # written again unchanged (a lost claim's re-read): nothing new
    a2 = [*a1, child(created_ns, 2, 0, "created")]
    slot.write(root_doc(a2))
    submitted = publish(rig)
    assert [t for t, _ in submitted] == [RETRY_SUBMITTED_DETAIL_TYPE] * 3
    assert submitted[0][1] == {
        "root": ROOT,
        "parent": ROOT,
        "child": "batches/a1-0",
        "attempt": 1,
        "rows": 10,
        "idempotencyKey": f"{ROOT}@{created_ns}#retry#{child_id(created_ns, 1, 0)}",
    }
    assert [(d["child"], d["parent"], d["attempt"], d["rows"]) for _, d in submitted[1:]] == [
        ("batches/a1-1", ROOT, 1, 11),
        ("batches/a2-0", "batches/a1", 2, 10),
    ]
    assert len({d["idempotencyKey"] for _, d in submitted}) == 3

    slot.write(root_doc(a2, final="final"), status=RETRY_DONE)
    slot.write(root_doc(a2, final="final"), status=RETRY_DONE)  # again: already final
    final = publish(rig)
    assert final == [
        (
            RESULTS_FINAL_DETAIL_TYPE,
            {
                "root": ROOT,
                "rows": {"total": 100, "answered": 97, "blocked": 2, "failed": 3},
                "errors": {"400": 2, "503": 1},
                "retried": 12,
                "attempts": 3,
                "location": FINAL_URI,
                "cost": {
                    "usd": None,
                    "retries_usd": None,
                    "model": None,
                    "prices": None,
                    "batch_discount": None,
                    "reason": REASON_FINAL_PREVIOUS_RELEASE,
                },
                "stopped": None,
                "idempotencyKey": f"{ROOT}@{created_ns}#final",
            },
        )
    ]
    # Every field of both schemas is carried by a real event; nothing else is.
    for detail_type, detail in (submitted[0], final[0]):
        props = set(json.loads(schema_file(detail_type).read_text())["properties"])
        assert set(detail) == props
        assert problems(detail_type, {**detail, "progress": 0.5})
        for key in detail:
            assert problems(detail_type, {k: v for k, v in detail.items() if k != key}), key
    assert problems(RESULTS_FINAL_DETAIL_TYPE, {**final[0][1], "idempotencyKey": "x#final#2"})
    assert problems(RETRY_SUBMITTED_DETAIL_TYPE, {**submitted[0][1], "attempt": 0})


def test_a_state_only_modify_is_announced_as_before(rig: Rig) -> None:
    subscribe_all(rig)
    rig.ingest(ROOT, State.RUNNING, 1)
    slot = Slot(rig, ROOT)
    slot.write(root_doc([child(slot.created_ns, 1, 0, "planned")]))
    publish(rig)
    rig.ingest(ROOT, State.SUCCEEDED, 2)  # the record only: the slot is not part of the change
    events = publish(rig)
    assert [(t, d["state"], d["previousState"], d["version"]) for t, d in events] == [
        (DETAIL_TYPE, "SUCCEEDED", "RUNNING", 2)
    ]
    assert set(events[0][1]) == set(json.loads(schema_file(DETAIL_TYPE).read_text())["required"])
    assert rig.store.get_retry(ROOT) is not None  # ingest kept the slot: no retry change


def test_a_record_carrying_a_state_change_and_a_retry_change_announces_the_state(
    rig: Rig,
) -> None:
    """Never written so by opstate (the engine's UpdateItem carries only the slot): if it were,
    the state change wins, as it does over marks and archive outcomes."""
    subscribe_all(rig)
    rig.ingest(ROOT, State.RUNNING, 1)
    slot = Slot(rig, ROOT)
    slot.write(root_doc([]))
    publish(rig)
    record = rig.store.get(ROOT)
    assert record is not None
    item = rig.ddb.get_item(TableName=rig.table, Key={"name": {"S": ROOT}}, ConsistentRead=True)[
        "Item"
    ]
    changed = serialize_item(
        item_from_record(
            dataclasses.replace(record, state=State.SUCCEEDED, version=record.version + 1),
            shards=4,
        )
    )
    retry = TypeSerializer().serialize(
        {"status": "done", "created_ns": slot.created_ns, "rev": 2, "due_ns": 0}
        | {"doc": root_doc([child(slot.created_ns, 1, 0, "created")], final="final")}
    )
    rig.ddb.put_item(TableName=rig.table, Item={**item, **changed, "retry": retry})
    assert [(t, d["state"]) for t, d in publish(rig)] == [(DETAIL_TYPE, "SUCCEEDED")]


def _modify(old: Mapping[str, Any], new: Mapping[str, Any]) -> Any:
    from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import (
        DynamoDBRecord,
    )

    return DynamoDBRecord(
        {
            "eventName": "MODIFY",
            "dynamodb": {
                "Keys": {"name": {"S": ROOT}},
                "OldImage": dict(old),
                "NewImage": dict(new),
                "SequenceNumber": "1",
            },
        }
    )


def test_unreadable_or_partial_retry_slots(rig: Rig) -> None:
    """A slot that is not a map, or a doc without children, announces nothing; a child marked
    created without its Gemini name is an unreadable record (the engine never writes one)."""
    rig.ingest(ROOT, State.SUCCEEDED, 1)
    item = rig.ddb.get_item(TableName=rig.table, Key={"name": {"S": ROOT}}, ConsistentRead=True)[
        "Item"
    ]
    serialize = TypeSerializer().serialize

    def image(doc: object) -> dict[str, Any]:
        return {**item, "retry": serialize({"status": "active", "rev": 1, "doc": doc})}

    created_ns = int(item["created_ns"]["N"])
    one = [child(created_ns, 1, 0, "created")]
    assert (
        build_entry(_modify({**item, "retry": {"S": "x"}}, image({"children": one})), "b") is None
    )
    assert build_entry(_modify(image({}), image({"children": "no"})), "b") is None
    assert build_entry(_modify(item, image(root_doc(one, final="final"))), "b") is None
    assert build_entry(_modify(image({}), image({"children": one})), "b") is not None
    nameless = [{**one[0], "name": None}]
    with pytest.raises(InvalidStreamRecordError, match="created retry child"):
        build_entry(_modify(image({}), image({"children": nameless})), "b")
