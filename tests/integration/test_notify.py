"""The notifier end to end on moto (in process): ingest → table stream → handler → bus → SQS.

Real changes go through ``opstate.ingest.ingest`` into a ``DynamoDBStore`` whose table is built
from template.yaml; the table's stream is read with ``dynamodbstreams`` and handed to the handler
the way Lambda hands it over; a rule on the custom bus forwards the events to an SQS queue, where
the test receives them like a consumer would.

Harness adaptations (moto vs Lambda), kept here and not in production code:
- botocore now resolves DynamoDB Streams to an account endpoint
  (``<account>.streams-ddb.<region>.amazonaws.com``) that moto does not route: the streams client
  is given moto's classic endpoint explicitly.
- ``get_records`` (through botocore) gives ``ApproximateCreationDateTime`` as a ``datetime``;
  Lambda gives epoch seconds. Lambda adds ``eventSourceARN``. The harness converts both and
  round-trips the event through JSON, as Lambda delivers it.
- moto never runs TTL: a ``DeleteItem`` stands in for the expiry (same ``REMOVE`` record, plus the
  ``userIdentity`` Lambda shows for TTL deletions).
- A moto bus delivers synchronously and moto's standard queue keeps insertion order, so the
  receive order below is the order of acceptance by ``PutEvents``.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import boto3
import pytest
from moto import mock_aws

from opstate import config as config_module
from opstate import notify
from opstate.domain.model import Decision, OpEvent
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.local.apigw import LocalLambdaContext
from opstate.notify import DETAIL_TYPE, SOURCE, Notifier
from opstate.observability import metrics as obs_metrics
from opstate.store.dynamodb import DynamoDBStore
from tests.support.event_schemas import check_envelope
from tests.support.template import create_table_from_template

REGION = "us-east-1"
STREAMS_ENDPOINT = f"https://streams.dynamodb.{REGION}.amazonaws.com"
S = 1_000_000_000
T0 = 1_767_225_600 * S  # 2026-01-01T00:00:00Z


def idem_key(name: str, version: int | str) -> str:
    """The idempotency key of a record created at T0."""
    return f"{name}@{T0}#{version}"


VEO = "models/veo-3.1-generate-preview/operations/v1"


@dataclass
class Rig:
    ddb: Any
    streams: Any
    events: Any
    sqs: Any
    table: str
    bus: str
    queue_url: str
    stream_arn: str
    store: DynamoDBStore
    iterator: str | None = None

    def ingest(self, name: str, state: State, t: int, **details: Any) -> Decision:
        return ingest(
            self.store, OpEvent(name, state, T0 + t * S, "test", details), clock_ns=lambda: T0
        )

    def read_stream(self) -> list[dict[str, Any]]:
        """Every stream record written since the last read, in Lambda's record shape."""
        if self.iterator is None:
            shard = self.streams.describe_stream(StreamArn=self.stream_arn)["StreamDescription"][
                "Shards"
            ][0]
            self.iterator = self.streams.get_shard_iterator(
                StreamArn=self.stream_arn,
                ShardId=shard["ShardId"],
                ShardIteratorType="TRIM_HORIZON",
            )["ShardIterator"]
        out: list[dict[str, Any]] = []
        while True:
            page = self.streams.get_records(ShardIterator=self.iterator, Limit=1000)
            self.iterator = page["NextShardIterator"]
            if not page["Records"]:
                return out
            out.extend(as_lambda_record(r, self.stream_arn) for r in page["Records"])

    def receive(self) -> list[dict[str, Any]]:
        """Every event the bus forwarded to the queue (the full EventBridge envelope), each
        checked against its detail's JSON Schema."""
        got: list[dict[str, Any]] = []
        while True:
            page = self.sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            messages = page.get("Messages", [])
            if not messages:
                return got
            for message in messages:
                envelope = json.loads(message["Body"])
                # Every event a notifier test receives matches its schema (schemas/).
                check_envelope(envelope)
                got.append(envelope)
                self.sqs.delete_message(
                    QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"]
                )


def as_lambda_record(raw: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    record = copy.deepcopy(raw)
    stream = record["dynamodb"]
    created = stream.get("ApproximateCreationDateTime")
    if isinstance(created, datetime):
        stream["ApproximateCreationDateTime"] = created.timestamp()
    record["eventSourceARN"] = stream_arn
    if record["eventName"] == "REMOVE":
        record["userIdentity"] = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
    return record


def lambda_event(records: list[dict[str, Any]]) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(json.dumps({"Records": records}))
    return event


def failed_ids(response: Any) -> list[str]:
    return [f["itemIdentifier"] for f in response["batchItemFailures"]]


def seq(record: dict[str, Any]) -> str:
    return str(record["dynamodb"]["SequenceNumber"])


@pytest.fixture
def rig() -> Iterator[Rig]:
    suffix = uuid.uuid4().hex[:8]
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        table = f"ops-{suffix}"
        create_table_from_template(ddb, table)
        stream_arn = ddb.describe_table(TableName=table)["Table"]["LatestStreamArn"]
        streams = boto3.client("dynamodbstreams", region_name=REGION, endpoint_url=STREAMS_ENDPOINT)
        events = boto3.client("events", region_name=REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        bus = f"opstate-{suffix}"
        events.create_event_bus(Name=bus)
        queue_url = sqs.create_queue(QueueName=f"consumer-{suffix}")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        # The subscription the docs describe: a rule on the detail-type (and source).
        events.put_rule(
            Name=f"state-changes-{suffix}",
            EventBusName=bus,
            EventPattern=json.dumps({"source": [SOURCE], "detail-type": [DETAIL_TYPE]}),
        )
        events.put_targets(
            Rule=f"state-changes-{suffix}",
            EventBusName=bus,
            Targets=[{"Id": "consumer", "Arn": queue_arn}],
        )
        store = DynamoDBStore(table, client=ddb)
        obs_metrics.clear_metrics()
        yield Rig(ddb, streams, events, sqs, table, bus, queue_url, stream_arn, store)
        obs_metrics.clear_metrics()


def drive_timelines(rig: Rig) -> list[Decision]:
    """Interleaved, out-of-order, duplicated deliveries for three operations."""
    steps = [
        ("batches/a", State.PENDING, 1),
        (VEO, State.RUNNING, 1),
        ("batches/a", State.RUNNING, 2),
        ("interactions/i1", State.RUNNING, 1),
        ("batches/a", State.RUNNING, 3),  # refreshed: same state, newer time
        ("batches/a", State.PENDING, 4),  # dropped: lower rank
        ("interactions/i1", State.REQUIRES_ACTION, 2),
        (VEO, State.SUCCEEDED, 5),
        ("batches/a", State.SUCCEEDED, 6),
        (VEO, State.RUNNING, 7),  # dropped: regress from terminal
        ("batches/a", State.FAILED, 7),  # dropped: terminal conflict
        ("batches/a", State.SUCCEEDED, 6),  # dropped: duplicate
        ("interactions/i1", State.REQUIRES_ACTION, 3),  # refreshed
        ("interactions/i1", State.SUCCEEDED, 4),
    ]
    decisions = [rig.ingest(name, state, t, step=i) for i, (name, state, t) in enumerate(steps)]
    reasons = Counter(str(d.reason) for d in decisions)
    assert reasons == {
        "created": 3,
        "advanced": 5,
        "refreshed": 2,
        "lower-rank": 1,
        "regress-from-terminal": 1,
        "terminal-conflict": 1,
        "stale-or-equal-update-time": 1,
    }
    return decisions


def expected_events(decisions: list[Decision]) -> list[tuple[str, int, str, str | None]]:
    out = []
    for d in decisions:
        if d.state_changed:
            assert d.record is not None
            previous = None if d.previous is None else str(d.previous.state)
            out.append((d.record.name, d.record.version, str(d.record.state), previous))
    return out


def test_one_event_per_state_change_in_order_with_previous_state(rig: Rig) -> None:
    decisions = drive_timelines(rig)
    records = rig.read_stream()
    # One stream record per applied decision, none for dropped ones.
    assert len(records) == sum(d.applied for d in decisions) == 10

    notifier = Notifier(rig.bus, rig.events)
    response = notifier.handle(lambda_event(records))

    assert failed_ids(response) == []
    received = rig.receive()
    assert all(e["source"] == SOURCE and e["detail-type"] == DETAIL_TYPE for e in received)
    details = [e["detail"] for e in received]
    got = [(d["name"], d["version"], d["state"], d["previousState"]) for d in details]
    want = expected_events(decisions)
    assert len(got) == len(want) == 8  # 3 created + 5 advanced; refreshed/dropped emit nothing
    # Ordered per operation (the cross-operation interleaving is free).
    for name in {w[0] for w in want}:
        assert [g for g in got if g[0] == name] == [w for w in want if w[0] == name]
    assert [g for g in got if g[0] == "batches/a"] == [
        ("batches/a", 1, "PENDING", None),
        ("batches/a", 2, "RUNNING", "PENDING"),
        ("batches/a", 4, "SUCCEEDED", "RUNNING"),
    ]
    a_done = next(d for d in details if d["idempotencyKey"] == idem_key("batches/a", 4))
    assert a_done["kind"] == "batch"
    assert a_done["updateTime"] == "2026-01-01T00:00:06.000000000Z"
    assert a_done["details"]["step"] == 8
    assert {d["kind"] for d in details} == {"batch", "video", "interaction"}
    assert len({d["idempotencyKey"] for d in details}) == len(details)

    # Expiry (REMOVE) of a terminal record and a refreshed-only batch emit nothing.
    rig.ddb.delete_item(TableName=rig.table, Key={"name": {"S": "batches/a"}})
    rig.ingest("batches/b", State.RUNNING, 1)
    rig.ingest("batches/b", State.RUNNING, 2)
    later = rig.read_stream()
    assert [r["eventName"] for r in later] == ["REMOVE", "INSERT", "MODIFY"]
    response = notifier.handle(lambda_event(later[:1] + later[2:]))
    assert failed_ids(response) == []
    assert rig.receive() == []


class RejectingEvents:
    """Wraps the moto events client: entries whose idempotencyKey is in ``reject`` come back as
    per-entry failures (never reach the bus); the others go through one real PutEvents call."""

    def __init__(self, real: Any, reject: set[str]) -> None:
        self.real = real
        self.reject = reject
        self.calls: list[int] = []

    def put_events(self, *, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append(len(Entries))
        keys = [json.loads(e["Detail"])["idempotencyKey"] for e in Entries]
        passed = [e for e, k in zip(Entries, keys, strict=True) if k not in self.reject]
        real_results = iter(self.real.put_events(Entries=passed)["Entries"] if passed else [])
        results = [
            {"ErrorCode": "InternalException", "ErrorMessage": "injected"}
            if k in self.reject
            else next(real_results)
            for k in keys
        ]
        return {"FailedEntryCount": sum("ErrorCode" in r for r in results), "Entries": results}


def test_partial_failure_retried_yields_no_duplicate_beyond_idempotency_key(rig: Rig) -> None:
    # Twelve operations created, then the first four advanced: 16 emitting records, so the
    # first delivery takes more than one PutEvents call.
    names = [f"batches/p{i:02d}" for i in range(12)]
    decisions = [rig.ingest(n, State.PENDING, 1) for n in names]
    decisions += [rig.ingest(n, State.RUNNING, 2) for n in names[:4]]
    records = rig.read_stream()
    assert len(records) == 16
    by_key = {
        idem_key(r["dynamodb"]["Keys"]["name"]["S"], r["dynamodb"]["NewImage"]["version"]["N"]): r
        for r in records
    }

    flaky = RejectingEvents(
        rig.events, reject={idem_key("batches/p01", 1), idem_key("batches/p07", 1)}
    )
    first = Notifier(rig.bus, flaky).handle(lambda_event(records))

    # Exactly the rejected records, plus p01#2, held back behind p01#1 (never sent ahead of it).
    assert failed_ids(first) == [
        seq(by_key[idem_key("batches/p01", 1)]),
        seq(by_key[idem_key("batches/p07", 1)]),
        seq(by_key[idem_key("batches/p01", 2)]),
    ]
    assert all(n <= 10 for n in flaky.calls) and len(flaky.calls) >= 2
    first_round = rig.receive()
    assert len(first_round) == 13
    assert idem_key("batches/p01", 2) not in {e["detail"]["idempotencyKey"] for e in first_round}

    # Lambda resumes the shard at the lowest reported sequence number: every record from there
    # on is delivered again, including ones already published.
    lowest = min(failed_ids(first), key=int)
    redelivered = [r for r in records if int(seq(r)) >= int(lowest)]
    flaky.reject.clear()
    second = Notifier(rig.bus, flaky).handle(lambda_event(redelivered))
    assert failed_ids(second) == []
    second_round = rig.receive()
    assert len(second_round) == len(redelivered)

    # The consumer de-duplicates on idempotencyKey.
    seen: set[str] = set()
    kept: list[dict[str, Any]] = []
    dropped = 0
    for envelope in first_round + second_round:
        key = envelope["detail"]["idempotencyKey"]
        if key in seen:
            dropped += 1
            continue
        seen.add(key)
        kept.append(envelope["detail"])
    # Only records redelivered after being published the first time are duplicates.
    assert dropped == len(redelivered) - 3
    assert sorted(seen) == sorted(by_key)
    want = expected_events(decisions)
    assert sorted(
        (d["name"], d["version"], d["state"], d["previousState"]) for d in kept
    ) == sorted(want)
    # Per operation the consumer still sees versions in order (p01: 1 then 2).
    assert [d["version"] for d in kept if d["name"] == "batches/p01"] == [1, 2]


def test_lambda_entry_publishes_with_the_bus_from_settings(rig: Rig, monkeypatch) -> None:
    import importlib.util
    from pathlib import Path

    monkeypatch.setenv("OPSTATE_EVENT_BUS_NAME", rig.bus)
    config_module.settings.cache_clear()
    notify._default_notifier.cache_clear()
    try:
        rig.ingest("batches/l1", State.RUNNING, 1)
        path = Path(__file__).resolve().parents[2] / "functions" / "notify" / "app.py"
        spec = importlib.util.spec_from_file_location("notify_app_integration", path)
        assert spec is not None and spec.loader is not None
        app = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(app)

        response = app.lambda_handler(lambda_event(rig.read_stream()), LocalLambdaContext())
    finally:
        config_module.settings.cache_clear()
        notify._default_notifier.cache_clear()

    assert response == {"batchItemFailures": []}
    (envelope,) = rig.receive()
    assert envelope["detail"]["idempotencyKey"] == idem_key("batches/l1", 1)
