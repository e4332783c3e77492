"""The notifier on hand-made DynamoDB Streams records (Lambda's record shape), with fake clients."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import ANY, Stubber
from hypothesis import given, settings
from hypothesis import strategies as st

from opstate import notify
from opstate.config import ConfigError, Settings
from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.local.apigw import LocalLambdaContext
from opstate.notify import (
    DETAIL_TYPE,
    MAX_REQUEST_BYTES,
    SOURCE,
    Notifier,
    build_entry,
    idempotency_key,
    notifier_from_settings,
)
from opstate.observability import logger as obs_logger
from opstate.observability import metrics as obs_metrics
from opstate.store.dynamodb import item_from_record, serialize_item

BUS = "opstate-test-bus"
ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/ops/stream/2026-01-01T00:00:00.000"
T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


def idem_key(name: str, version: int | str) -> str:
    """The idempotency key of a record created at T0."""
    return f"{name}@{T0}#{version}"


@pytest.fixture(autouse=True)
def _fresh_metrics() -> Iterator[None]:
    """Powertools buffers metrics process-wide until a flush: start and end each test empty."""
    obs_metrics.clear_metrics()
    yield
    obs_metrics.clear_metrics()


# --- hand-made stream records ------------------------------------------------------------------


def op(
    name: str,
    state: State,
    version: int,
    *,
    update_ns: int | None = None,
    details: dict[str, Any] | None = None,
) -> OpRecord:
    return OpRecord(
        name=name,
        state=state,
        update_time_ns=T0 + version * 1_000_000_000 if update_ns is None else update_ns,
        version=version,
        source="test",
        details=details or {},
        created_ns=T0,
        applied_ns=T0 + version,
    )


def image(record: OpRecord) -> dict[str, Any]:
    return serialize_item(item_from_record(record, now_ns=T0))


class Stream:
    """Builds Lambda-shaped DynamoDB Streams records with increasing sequence numbers."""

    def __init__(self) -> None:
        self.seq = 100_000_000_000_000_000_000

    def _record(self, event_name: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        return {
            "eventID": f"evt-{self.seq}",
            "eventName": event_name,
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": "us-east-1",
            "dynamodb": {
                "ApproximateCreationDateTime": 1767225600.0,
                "Keys": {"name": {"S": name}},
                "SequenceNumber": str(self.seq),
                "SizeBytes": 200,
                "StreamViewType": "NEW_AND_OLD_IMAGES",
                **body,
            },
            "eventSourceARN": ARN,
        }

    def insert(self, new: OpRecord) -> dict[str, Any]:
        return self._record("INSERT", new.name, {"NewImage": image(new)})

    def modify(self, old: OpRecord, new: OpRecord) -> dict[str, Any]:
        return self._record("MODIFY", new.name, {"OldImage": image(old), "NewImage": image(new)})

    def remove(self, old: OpRecord) -> dict[str, Any]:
        return self._record("REMOVE", old.name, {"OldImage": image(old)})

    def timeline(self, name: str, states: Sequence[State]) -> list[dict[str, Any]]:
        """INSERT of the first state, then one MODIFY per further state (versions 1, 2, ...)."""
        records = [op(name, s, v) for v, s in enumerate(states, start=1)]
        out = [self.insert(records[0])]
        out += [self.modify(a, b) for a, b in itertools.pairwise(records)]
        return out


def seq_of(record: dict[str, Any]) -> str:
    return str(record["dynamodb"]["SequenceNumber"])


def event(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {"Records": list(records)}


# --- fake EventBridge --------------------------------------------------------------------------


@dataclass
class FakeEvents:
    """Records every PutEvents call; ``reject(detail)`` returns an error code to fail an entry."""

    reject: Callable[[dict[str, Any]], str | None] = lambda detail: None
    raise_on_call: Callable[[int], BaseException | None] = lambda call: None
    calls: list[list[dict[str, Any]]] = field(default_factory=list)

    def put_events(self, *, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append(list(Entries))
        error = self.raise_on_call(len(self.calls))
        if error is not None:
            raise error
        results: list[dict[str, Any]] = []
        for entry in Entries:
            code = self.reject(json.loads(entry["Detail"]))
            if code:
                results.append({"ErrorCode": code, "ErrorMessage": "injected"})
            else:
                results.append({"EventId": f"id-{len(self.calls)}-{len(results)}"})
        failed = sum(1 for r in results if "ErrorCode" in r)
        return {"FailedEntryCount": failed, "Entries": results}

    @property
    def details(self) -> list[dict[str, Any]]:
        return [json.loads(e["Detail"]) for call in self.calls for e in call]

    def accepted(self) -> list[dict[str, Any]]:
        return [d for d in self.details if not self.reject(d)]


def failures(response: dict[str, Any]) -> list[str]:
    return [f["itemIdentifier"] for f in response["batchItemFailures"]]


def run(records: list[dict[str, Any]], client: Any) -> dict[str, Any]:
    return dict(Notifier(BUS, client).handle(event(records)))


# --- what is emitted ---------------------------------------------------------------------------


def test_insert_emits_one_event_with_null_previous_state() -> None:
    stream, client = Stream(), FakeEvents()
    rec = op("batches/a1", State.PENDING, 1, details={"user_metadata": {"k": "v"}, "n": 3})
    response = run([stream.insert(rec)], client)

    assert failures(response) == []
    assert len(client.calls) == 1
    (entry,) = client.calls[0]
    assert entry["Source"] == SOURCE == "gemini-opstate"
    assert entry["DetailType"] == DETAIL_TYPE == "Operation State Changed"
    assert entry["EventBusName"] == BUS
    assert json.loads(entry["Detail"]) == {
        "name": "batches/a1",
        "kind": "batch",
        "state": "PENDING",
        "previousState": None,
        "version": 1,
        "updateTime": "2026-01-01T00:00:01.000000000Z",
        "details": {"user_metadata": {"k": "v"}, "n": 3},
        "idempotencyKey": idem_key("batches/a1", 1),
    }


def test_modify_with_state_change_carries_previous_state() -> None:
    stream, client = Stream(), FakeEvents()
    old = op("models/veo-3.1-generate-preview/operations/v9", State.RUNNING, 2)
    new = op(old.name, State.SUCCEEDED, 3, details={"uri": "gs://x"})
    response = run([stream.modify(old, new)], client)

    assert failures(response) == []
    (detail,) = client.details
    assert detail["kind"] == "video"
    assert detail["state"] == "SUCCEEDED"
    assert detail["previousState"] == "RUNNING"
    assert detail["version"] == 3
    assert detail["idempotencyKey"] == idem_key(old.name, 3)
    assert detail["details"] == {"uri": "gs://x"}


def test_refreshed_modify_and_remove_emit_nothing() -> None:
    stream, client = Stream(), FakeEvents()
    old = op("batches/r", State.RUNNING, 1)
    refreshed = op("batches/r", State.RUNNING, 2, details={"progress": 50})
    done = op("batches/t", State.SUCCEEDED, 4)
    response = run([stream.modify(old, refreshed), stream.remove(done)], client)

    assert failures(response) == []
    assert client.calls == []


def test_unknown_update_time_is_null() -> None:
    stream, client = Stream(), FakeEvents()
    run([stream.insert(op("batches/z", State.PENDING, 1, update_ns=0))], client)
    assert client.details[0]["updateTime"] is None


def test_build_entry_is_pure_and_skips_non_changes() -> None:
    from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import (
        DynamoDBRecord,
    )

    stream = Stream()
    a1, a2 = op("batches/p", State.PENDING, 1), op("batches/p", State.PENDING, 2)
    assert build_entry(DynamoDBRecord(stream.modify(a1, a2)), BUS) is None
    entry = build_entry(DynamoDBRecord(stream.insert(a1)), BUS)
    assert entry is not None
    assert entry["EventBusName"] == BUS


def test_oversized_details_are_omitted_not_lost() -> None:
    stream, client = Stream(), FakeEvents()
    big = {"blob": "x" * (MAX_REQUEST_BYTES + 10)}
    response = run([stream.insert(op("batches/big", State.SUCCEEDED, 1, details=big))], client)

    assert failures(response) == []
    (detail,) = client.details
    assert detail["details"] == {}
    assert detail["detailsOmitted"] is True
    assert detail["state"] == "SUCCEEDED"


# --- chunking, partial failure, ordering --------------------------------------------------------


def test_sends_in_chunks_of_at_most_ten_in_stream_order() -> None:
    stream, client = Stream(), FakeEvents()
    records = [stream.insert(op(f"batches/c{i:02d}", State.PENDING, 1)) for i in range(25)]
    response = run(records, client)

    assert failures(response) == []
    assert [len(call) for call in client.calls] == [10, 10, 5]
    assert [d["name"] for d in client.details] == [f"batches/c{i:02d}" for i in range(25)]


def test_partial_failure_reports_exactly_the_rejected_records() -> None:
    stream = Stream()
    client = FakeEvents(
        reject=lambda d: (
            "ThrottlingException" if d["name"] in {"batches/c03", "batches/c11"} else None
        )
    )
    records = [stream.insert(op(f"batches/c{i:02d}", State.PENDING, 1)) for i in range(14)]
    response = run(records, client)

    assert failures(response) == [seq_of(records[3]), seq_of(records[11])]
    assert len(client.calls) == 2
    assert len(client.accepted()) == 12


def test_stubbed_real_client_reads_failed_entry_count() -> None:
    real = boto3.client("events", region_name="us-east-1")
    stream = Stream()
    records = [stream.insert(op(f"batches/s{i}", State.RUNNING, 1)) for i in range(3)]
    with Stubber(real) as stubber:
        stubber.add_response(
            "put_events",
            {
                "FailedEntryCount": 1,
                "Entries": [
                    {"EventId": "e-0"},
                    {"ErrorCode": "InternalFailure", "ErrorMessage": "try again"},
                    {"EventId": "e-2"},
                ],
            },
            {"Entries": ANY},
        )
        response = run(records, real)
        stubber.assert_no_pending_responses()

    assert failures(response) == [seq_of(records[1])]


def test_one_entry_per_operation_per_call_and_earlier_versions_first() -> None:
    stream, client = Stream(), FakeEvents()
    x = stream.timeline("batches/x", [State.PENDING, State.RUNNING, State.SUCCEEDED])
    others = [stream.insert(op(f"batches/o{i}", State.PENDING, 1)) for i in range(4)]
    # Interleave: x1 o0 x2 o1 o2 x3 o3
    records = [x[0], others[0], x[1], others[1], others[2], x[2], others[3]]
    response = run(records, client)

    assert failures(response) == []
    for call in client.calls:
        names = [json.loads(e["Detail"])["name"] for e in call]
        assert len(names) == len(set(names))
    x_versions = [d["version"] for d in client.details if d["name"] == "batches/x"]
    assert x_versions == [1, 2, 3]
    x_calls = [i for i, call in enumerate(client.calls) for e in call if "batches/x" in e["Detail"]]
    assert x_calls == sorted(x_calls) and len(set(x_calls)) == 3
    # Everything else rides along: three calls (one per x version), not seven.
    assert len(client.calls) == 3


def test_failed_record_holds_back_later_records_of_the_same_operation() -> None:
    stream = Stream()
    client = FakeEvents(
        reject=lambda d: (
            "InternalFailure" if d["idempotencyKey"] == idem_key("batches/x", 2) else None
        )
    )
    x = stream.timeline("batches/x", [State.PENDING, State.RUNNING, State.SUCCEEDED])
    y = stream.timeline("batches/y", [State.PENDING, State.FAILED])
    records = [x[0], y[0], x[1], y[1], x[2]]
    response = run(records, client)

    # x#2 rejected, x#3 held back (never sent), everything else published.
    assert failures(response) == [seq_of(x[1]), seq_of(x[2])]
    sent_keys = [d["idempotencyKey"] for d in client.details]
    assert idem_key("batches/x", 3) not in sent_keys
    assert [d["idempotencyKey"] for d in client.accepted()] == [
        idem_key("batches/x", 1),
        idem_key("batches/y", 1),
        idem_key("batches/y", 2),
    ]


def test_failed_call_fails_its_chunk_and_spares_the_others() -> None:
    stream = Stream()
    error = ClientError({"Error": {"Code": "ServiceUnavailable", "Message": "down"}}, "PutEvents")
    client = FakeEvents(raise_on_call=lambda call: error if call == 1 else None)
    records = [stream.insert(op(f"batches/k{i:02d}", State.PENDING, 1)) for i in range(13)]
    response = run(records, client)

    assert failures(response) == [seq_of(r) for r in records[:10]]
    assert len(client.calls) == 2
    assert [len(c) for c in client.calls] == [10, 3]


def test_unreadable_record_fails_alone_and_holds_back_its_operation() -> None:
    stream, client = Stream(), FakeEvents()
    a1, a2, a3 = (op("batches/a", s, v) for v, s in enumerate(State, start=1) if v <= 3)
    broken = stream.modify(a1, a2)
    del broken["dynamodb"]["OldImage"]  # a stream without old images cannot be read
    records = [stream.insert(a1), broken, stream.modify(a2, a3)]
    records.append(stream.insert(op("batches/b", State.PENDING, 1)))
    response = run(records, client)

    assert failures(response) == [seq_of(records[1]), seq_of(records[2])]
    assert [d["idempotencyKey"] for d in client.details] == [
        idem_key("batches/a", 1),
        idem_key("batches/b", 1),
    ]


def test_entire_batch_failing_is_reported_not_raised() -> None:
    stream = Stream()
    client = FakeEvents(reject=lambda d: "AccessDeniedException")
    records = [stream.insert(op(f"batches/e{i}", State.PENDING, 1)) for i in range(3)]
    response = run(records, client)
    assert failures(response) == [seq_of(r) for r in records]


def test_processor_is_reusable_across_invocations() -> None:
    stream = Stream()
    bad = {"batches/q0"}
    client = FakeEvents(reject=lambda d: "Throttled" if d["name"] in bad else None)
    notifier = Notifier(BUS, client)
    records = [stream.insert(op(f"batches/q{i}", State.PENDING, 1)) for i in range(2)]

    first = notifier.handle(event(records))
    bad.clear()
    second = notifier.handle(event([records[0]]))

    assert failures(dict(first)) == [seq_of(records[0])]
    assert failures(dict(second)) == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans()),
        min_size=0,
        max_size=30,
    )
)
def test_ordering_and_reporting_invariants(plan: list[tuple[int, int, bool]]) -> None:
    """Any batch: chunks ≤ 10 with one entry per operation, versions sent in order, nothing
    sent after an operation's failure, failures reported == rejected + held back."""
    records, emitting, rejected_keys = planned_batch(plan)
    client = FakeEvents(
        reject=lambda d: "Injected" if d["idempotencyKey"] in rejected_keys else None
    )
    response = run(records, client)

    for call in client.calls:
        names = [json.loads(e["Detail"])["name"] for e in call]
        assert 1 <= len(call) <= 10
        assert len(names) == len(set(names))
    assert failures(response) == expected_failures(emitting, rejected_keys)
    sent = [d["idempotencyKey"] for d in client.details]
    for name in {n for _, n, _ in emitting}:
        mine = [k for _, n, k in emitting if n == name]
        sent_mine = [k for k in sent if k.startswith(name + "#")]
        assert sent_mine == mine[: len(sent_mine)]  # a prefix, in stream order
        # Nothing after the first rejected entry of the operation was sent.
        if any(k in rejected_keys for k in sent_mine):
            assert sent_mine[-1] in rejected_keys


def planned_batch(
    plan: list[tuple[int, int, bool]],
) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]], set[str]]:
    """(stream records, (seq, name, key) of those that emit, keys to reject) for a plan of
    (operation, step: 0 same state / 1 running / 2 failed, reject) steps."""
    stream = Stream()
    versions: dict[str, OpRecord] = {}
    records: list[dict[str, Any]] = []
    rejected_keys: set[str] = set()
    emitting: list[tuple[str, str, str]] = []
    for op_index, step, reject in plan:
        name = f"batches/h{op_index}"
        current = versions.get(name)
        if current is None:
            new = op(name, State.PENDING, 1)
            rec = stream.insert(new)
        else:
            new = op(name, next_state(current, step), current.version + 1)
            rec = stream.modify(current, new)
        versions[name] = new
        records.append(rec)
        if current is None or current.state != new.state:
            key = idem_key(name, new.version)
            emitting.append((seq_of(rec), name, key))
            if reject:
                rejected_keys.add(key)
    return records, emitting, rejected_keys


def next_state(current: OpRecord, step: int) -> State:
    """The state a plan's step moves ``current`` to (a terminal state stays)."""
    if current.terminal or step == 0:
        return current.state
    return State.RUNNING if step == 1 else State.FAILED


def expected_failures(emitting: list[tuple[str, str, str]], rejected_keys: set[str]) -> list[str]:
    """The sequence numbers reported failed: each rejected entry and every later entry of its
    operation (held back)."""
    expected: list[str] = []
    dead: set[str] = set()
    for seq, name, key in emitting:
        if name in dead or key in rejected_keys:
            dead.add(name)
            expected.append(seq)
    return expected


# --- configuration and the Lambda entry ----------------------------------------------------------


def test_missing_bus_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="OPSTATE_EVENT_BUS_NAME"):
        notifier_from_settings(Settings.from_env({}), client=FakeEvents())


def test_bus_name_comes_from_settings() -> None:
    config = Settings.from_env({"OPSTATE_EVENT_BUS_NAME": "my-bus"})
    assert notifier_from_settings(config, client=FakeEvents()).bus_name == "my-bus"


def load_entry() -> Any:
    path = Path(__file__).resolve().parents[2] / "functions" / "notify" / "app.py"
    spec = importlib.util.spec_from_file_location("notify_app_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lambda_entry_returns_failures_and_emits_metrics(monkeypatch, capsys) -> None:
    stream = Stream()
    client = FakeEvents(reject=lambda d: "Throttled" if d["name"] == "batches/m1" else None)
    notifier = Notifier(BUS, client)
    monkeypatch.setattr(notify, "_default_notifier", lambda: notifier)
    records = [stream.insert(op(f"batches/m{i}", State.PENDING, 1)) for i in range(3)]
    app = load_entry()

    response = app.lambda_handler(event(records), LocalLambdaContext())

    assert response == {"batchItemFailures": [{"itemIdentifier": seq_of(records[1])}]}
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "_aws" in line]
    metrics: dict[str, Any] = {}
    for blob in blobs:
        for definition in blob["_aws"]["CloudWatchMetrics"]:
            for metric in definition["Metrics"]:
                value = blob[metric["Name"]]
                metrics[metric["Name"]] = sum(value) if isinstance(value, list) else value
    assert metrics["EventsPublished"] == 2
    assert metrics["PublishFailures"] == 1


def test_a_record_created_again_after_ttl_never_reuses_a_key() -> None:
    """TTL removed a terminal record and discovery created it again: version restarts at 1,
    and so would ``<name>#1``; the creation time tells the two incarnations apart."""
    stream, client = Stream(), FakeEvents()
    first = op("batches/again", State.PENDING, 1)
    second = dataclasses.replace(
        op("batches/again", State.SUCCEEDED, 1), created_ns=T0 + 90 * 86_400 * 10**9
    )
    assert failures(run([stream.insert(first), stream.insert(second)], client)) == []
    keys = [d["idempotencyKey"] for d in client.details]
    assert keys == [f"batches/again@{T0}#1", f"batches/again@{second.created_ns}#1"]
    assert len(set(keys)) == 2


def test_an_item_without_a_creation_time_keeps_a_stable_key() -> None:
    """An item as an older writer shaped it, without created_ns: the key is ``<name>#<v>``, the
    same every time the record is read."""
    stream, client = Stream(), FakeEvents()
    new = op("batches/legacy", State.RUNNING, 4)
    record = stream.insert(new)
    for attr in ("created_ns", "created_at"):
        record["dynamodb"]["NewImage"].pop(attr, None)
    run([record], client)
    run([record], client)
    assert [d["idempotencyKey"] for d in client.details] == ["batches/legacy#4"] * 2
    assert idempotency_key(dataclasses.replace(new, created_ns=0)) == "batches/legacy#4"


# --- records without a position, and per-invocation counters ------------------------------------


def logged(caplog: pytest.LogCaptureFixture, message: str) -> list[dict[str, Any]]:
    return [vars(r) for r in caplog.records if r.getMessage() == message]


@pytest.mark.parametrize("broken", ["no-dynamodb-section", "rejected-without-sequence-number"])
def test_record_without_a_sequence_number_fails_alone_not_the_batch(
    broken: str, caplog: pytest.LogCaptureFixture
) -> None:
    stream = Stream()
    client = FakeEvents(reject=lambda d: "Throttled" if d["name"] != "batches/a" else None)
    names = ("batches/a", "batches/b", "batches/c")
    records = [stream.insert(op(n, State.PENDING, 1)) for n in names]
    if broken == "no-dynamodb-section":
        del records[1]["dynamodb"]  # unreadable, and has no position in the shard
    else:
        del records[1]["dynamodb"]["SequenceNumber"]  # readable, rejected, no position

    response = run(records, client)

    # The others are settled as usual: a published, c's rejection reported by its own number.
    assert failures(response) == [seq_of(records[2])]
    assert [d["idempotencyKey"] for d in client.accepted()] == [idem_key("batches/a", 1)]
    (summary,) = logged(caplog, "stream batch processed")
    assert (summary["failed"], summary["unreportable"], summary["published"]) == (2, 1, 1)


def test_put_events_calls_are_counted_per_invocation(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=obs_logger.name)
    stream, client = Stream(), FakeEvents()
    notifier = Notifier(BUS, client, max_entries=2)  # one warm container, several invocations
    for _ in range(3):
        records = [stream.insert(op(f"batches/w{stream.seq}", State.PENDING, 1)) for _ in range(3)]
        notifier.handle(event(records))
    assert [s["put_events_calls"] for s in logged(caplog, "stream batch processed")] == [2, 2, 2]
    assert len(client.calls) == 6


def test_a_clean_batch_is_tallied_at_debug_a_failed_one_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=obs_logger.name)
    stream = Stream()
    client = FakeEvents(reject=lambda d: "Throttled" if d["name"] == "batches/bad" else None)
    run([stream.insert(op("batches/good", State.PENDING, 1))], client)
    assert logged(caplog, "stream batch processed") == []  # at INFO: nothing to act on

    caplog.set_level(logging.DEBUG, logger=obs_logger.name)
    run([stream.insert(op("batches/good2", State.PENDING, 1))], client)
    run([stream.insert(op("batches/bad", State.PENDING, 1))], client)
    clean, failed = logged(caplog, "stream batch processed")
    assert (clean["levelname"], clean["published"], clean["failed"]) == ("DEBUG", 1, 0)
    assert (failed["levelname"], failed["published"], failed["failed"]) == ("WARNING", 0, 1)


# --- lost / overdue marks ------------------------------------------------------------------------


def test_a_same_state_modify_announces_only_a_newly_set_mark() -> None:
    from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

    from opstate.notify import LOST_DETAIL_TYPE, OVERDUE_DETAIL_TYPE, build_entry

    stream = Stream()
    record = op("batches/m", State.RUNNING, 2)

    def modify(old_extra: dict[str, Any], new_extra: dict[str, Any]) -> DynamoDBRecord:
        raw = stream.modify(record, record)
        raw["dynamodb"]["OldImage"].update(old_extra)
        raw["dynamodb"]["NewImage"].update(new_extra)
        return DynamoDBRecord(json.loads(json.dumps(raw)))

    lost_ns = {"lost_ns": {"N": str(T0 + 5)}, "poll_misses": {"N": "3"}}
    overdue = {"overdue_ns": {"N": str(T0 + 7)}}
    # A schedule write with no new mark announces nothing.
    assert build_entry(modify({}, {"poll_misses": {"N": "1"}}), "bus") is None
    assert build_entry(modify(overdue, overdue), "bus") is None
    entry = build_entry(modify({}, lost_ns), "bus")
    assert entry is not None and entry["DetailType"] == LOST_DETAIL_TYPE
    detail = json.loads(entry["Detail"])
    assert detail["idempotencyKey"] == f"batches/m#lost#{T0 + 5}"
    assert detail["notFoundCount"] == 3 and "previousState" not in detail
    entry = build_entry(modify({}, overdue), "bus")
    assert entry is not None and entry["DetailType"] == OVERDUE_DETAIL_TYPE
    assert json.loads(entry["Detail"])["idempotencyKey"] == "batches/m#overdue"
