"""Every event the bus carries has a JSON Schema (draft 2020-12) for its ``detail`` under
``schemas/``, named by its detail-type in kebab case, referenced from docs/notifier.md; every
event the notifier really publishes (here, on moto) validates against it, and a field added to
an event without its schema, or to a schema without any event carrying it, fails."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from opstate import notify
from opstate.domain.names import Kind
from opstate.domain.states import State, is_terminal
from opstate.notify import SOURCE, Notifier
from opstate.store.dynamodb import item_from_record, serialize_item
from opstate.store.port import PollState
from tests.integration.test_notify import Rig, drive_timelines, lambda_event, rig
from tests.support.event_schemas import ROOT, SCHEMAS, problems, schema_file, validator

__all__ = ["rig"]  # the fixture

DETAIL_TYPES = sorted(
    value
    for key, value in vars(notify).items()
    if key.endswith("DETAIL_TYPE") and isinstance(value, str)
)


def test_every_detail_type_has_a_valid_schema_and_every_schema_a_detail_type() -> None:
    assert {"Operation State Changed", "Operation Lost", "Operation Overdue"} <= set(DETAIL_TYPES)
    for detail_type in DETAIL_TYPES:
        schema = json.loads(schema_file(detail_type).read_text(encoding="utf-8"))
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["title"] == detail_type
        assert schema["additionalProperties"] is False
        validator(detail_type)  # check_schema
    assert {p.name for p in SCHEMAS.glob("*.schema.json")} == {
        schema_file(t).name for t in DETAIL_TYPES
    }


def test_the_schemas_enumerate_the_codes_states_and_kinds() -> None:
    for detail_type in DETAIL_TYPES:
        props = json.loads(schema_file(detail_type).read_text(encoding="utf-8"))["properties"]
        if "state" in props:
            # Results events come only for terminal records (archiving never changes a state).
            states = [s for s in State if is_terminal(s)] if "Results" in detail_type else State
            assert set(props["state"]["enum"]) == {str(s) for s in states}
        if "enum" in props.get("kind", {}):
            assert set(props["kind"]["enum"]) == {str(k) for k in Kind}


def test_docs_notifier_references_every_schema() -> None:
    text = (ROOT / "docs" / "notifier.md").read_text(encoding="utf-8")
    for detail_type in DETAIL_TYPES:
        assert f"schemas/{schema_file(detail_type).name}" in text, detail_type


def _publish_every_kind_of_event(rig: Rig) -> list[dict[str, Any]]:
    """State changes, a lost and an overdue mark, and a change too large to carry its details,
    through the real notifier onto the moto bus; every envelope received."""
    queue_arn = rig.sqs.get_queue_attributes(QueueUrl=rig.queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    rig.events.put_rule(
        Name="everything", EventBusName=rig.bus, EventPattern=json.dumps({"source": [SOURCE]})
    )
    rig.events.put_targets(
        Rule="everything", EventBusName=rig.bus, Targets=[{"Id": "all", "Arn": queue_arn}]
    )
    drive_timelines(rig)
    rig.ingest("batches/marked", State.RUNNING, 1)
    record = rig.store.get("batches/marked")
    assert record is not None
    assert rig.store.set_poll("batches/marked", 1, PollState(due_ns=1, overdue_ns=5))
    assert rig.store.set_poll(
        "batches/marked", 1, PollState(lost_ns=9, misses=3, missing_since_ns=7, overdue_ns=5)
    )
    # Too large for EventBridge (no store would accept it: written around the store's checks).
    big = dataclasses.replace(record, name="batches/huge", details={"blob": "x" * 300_000})
    rig.ddb.put_item(TableName=rig.table, Item=serialize_item(item_from_record(big, shards=4)))
    response = Notifier(rig.bus, rig.events).handle(lambda_event(rig.read_stream()))
    assert response["batchItemFailures"] == []
    return rig.receive()  # each one checked against its schema (Rig.receive)


def test_every_published_event_matches_its_schema_and_uses_every_field(rig: Rig) -> None:
    received = _publish_every_kind_of_event(rig)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for envelope in received:
        assert envelope["source"] == SOURCE
        by_type.setdefault(envelope["detail-type"], []).append(envelope["detail"])
    assert set(by_type) == {"Operation State Changed", "Operation Lost", "Operation Overdue"}
    for detail_type, details in by_type.items():
        for detail in details:
            assert problems(detail_type, detail) == []
        props = set(json.loads(schema_file(detail_type).read_text())["properties"])
        seen = set().union(*(d.keys() for d in details))
        optional = {"detailsOmitted"} if detail_type != "Operation State Changed" else set()
        # a schema field no published event carries is a schema ahead of the code
        assert props - seen <= optional, (detail_type, props - seen)
    assert any(d.get("detailsOmitted") for d in by_type["Operation State Changed"])


def test_a_field_added_or_removed_without_the_schema_fails(rig: Rig) -> None:
    received = _publish_every_kind_of_event(rig)
    for envelope in received:
        detail_type, detail = envelope["detail-type"], envelope["detail"]
        assert problems(detail_type, {**detail, "progress": 0.5})  # added to the event only
        for key in ("name", "state", "version", "idempotencyKey"):
            assert problems(detail_type, {k: v for k, v in detail.items() if k != key})
        assert problems(detail_type, {**detail, "state": "DONE"})
        assert problems(detail_type, {**detail, "updateTime": "2026-01-01T00:00:00Z"})


@pytest.mark.parametrize("detail_type", ["Operation State Changed"])
def test_the_state_changed_schema_allows_null_previous_state(detail_type: str) -> None:
    detail = {
        "name": "batches/x",
        "kind": "batch",
        "state": "PENDING",
        "previousState": None,
        "version": 1,
        "updateTime": None,
        "details": {},
        "idempotencyKey": "batches/x@1#1",
    }
    assert problems(detail_type, detail) == []
