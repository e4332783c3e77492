"""The conflict path on DynamoDB: lost races resolved from the returned item, bounded attempts,
and store faults surfacing as retryable errors."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from moto import mock_aws

from opstate.domain.model import OpEvent, OpRecord, Reason
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.ingest import IngestContentionError, ingest, ingest_counted
from opstate.store import MemoryStore, RetryableError, StoreUnavailableError, WriteOutcome
from opstate.store.dynamodb import DynamoDBStore, item_from_record, serialize_item
from opstate.store.port import RecordRejectedError
from tests.support.motoserver import free_port
from tests.support.stores import dynamodb_client, unique_table
from tests.support.template import create_table_from_template

T0 = parse_time("2026-06-01T10:00:00Z")
NOW = parse_time("2026-06-01T12:00:00Z")


def no_sleep(_: float) -> None:
    return None


class CallCounter:
    """Counts DynamoDB API calls made through a client (botocore ``before-call`` hook)."""

    def __init__(self, client: Any) -> None:
        self.calls: Counter[str] = Counter()
        client.meta.events.register("before-call.dynamodb.*", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        self.calls[model.name] += 1


@pytest.fixture
def aws() -> Iterator[tuple[Any, str]]:
    """(client, table) in moto's in-process mock, the table built from the template."""
    with mock_aws():
        client = dynamodb_client()
        table = unique_table()
        create_table_from_template(client, table)
        yield client, table


def ev(name: str, state: State, t: int, details: dict[str, Any] | None = None) -> OpEvent:
    return OpEvent(name, state, t, "webhook", details or {})


def test_race_between_read_and_write_is_resolved_from_the_returned_item(
    aws: tuple[Any, str],
) -> None:
    client, table = aws
    name = "batches/race"
    store = DynamoDBStore(table, client=client)
    assert ingest(store, ev(name, State.PENDING, T0, {"from": "create"})).applied

    # Another writer (its own client) advances the record right after our read.
    rival = DynamoDBStore(table, client=dynamodb_client())
    rival_record = OpRecord(name, State.RUNNING, T0 + 5, 2, "poll", {"rival": 1}, NOW, NOW)
    injected: list[bool] = []

    def race(params: dict[str, Any], **_: Any) -> None:
        if not injected:
            injected.append(True)
            assert rival.replace_if_version(rival_record, expected_version=1).ok

    read = store.get(name)  # our read (the caller's, handed to ingest as known)
    client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", race)
    counter = CallCounter(client)
    done = ingest_counted(
        store,
        ev(name, State.SUCCEEDED, T0 + 9, {"out": "f"}),
        sleep=no_sleep,
        clock_ns=lambda: NOW,
        known=read,
    )
    decision = done.decision

    assert injected
    assert decision.applied and decision.reason is Reason.ADVANCED
    assert (done.attempts, done.conflicts) == (2, 1)
    assert decision.previous == rival_record  # reduced against the winner, not our stale read
    assert counter.calls == Counter({"UpdateItem": 2})  # no second read
    stored = store.get(name)
    assert stored is not None
    assert (stored.state, stored.version) == (State.SUCCEEDED, 3)
    assert stored.details == {"rival": 1, "out": "f"}  # merged onto the winner


def test_a_rival_before_the_one_call_write_is_its_condition_s_current(
    aws: tuple[Any, str],
) -> None:
    """Without a read, the rival's record is what the one-call write's condition meets: the
    event advances the winner, in one call, its details merged onto the winner's."""
    client, table = aws
    name = "batches/race-one"
    store = DynamoDBStore(table, client=client)
    assert ingest(store, ev(name, State.PENDING, T0, {"from": "create"})).applied
    rival = DynamoDBStore(table, client=dynamodb_client())
    rival_record = OpRecord(name, State.RUNNING, T0 + 5, 2, "poll", {"rival": 1}, NOW, NOW)

    def race(**_: Any) -> None:
        assert rival.replace_if_version(rival_record, expected_version=1).ok

    client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", race)
    counter = CallCounter(client)
    done = ingest_counted(
        store, ev(name, State.SUCCEEDED, T0 + 9, {"out": "f"}), clock_ns=lambda: NOW
    )
    assert done.decision.reason is Reason.ADVANCED and done.attempts == 1
    assert done.decision.previous == rival_record
    assert counter.calls == Counter({"UpdateItem": 1})
    stored = store.get(name)
    assert stored is not None and (stored.state, stored.version) == (State.SUCCEEDED, 3)
    assert stored.details == {"rival": 1, "out": "f"}


def test_race_that_makes_our_event_stale_is_dropped_without_a_second_read(
    aws: tuple[Any, str],
) -> None:
    client, table = aws
    name = "batches/race-stale"
    store = DynamoDBStore(table, client=client)
    assert ingest(store, ev(name, State.RUNNING, T0)).applied
    rival = DynamoDBStore(table, client=dynamodb_client())
    winner = OpRecord(name, State.CANCELLED, T0 + 1, 2, "poll", {}, NOW, NOW)
    fired: list[bool] = []

    def race(**_: Any) -> None:
        if not fired:
            fired.append(True)
            assert rival.replace_if_version(winner, expected_version=1).ok

    client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", race)
    counter = CallCounter(client)
    decision = ingest(store, ev(name, State.RUNNING, T0 + 3), sleep=no_sleep)
    assert not decision.applied and decision.reason is Reason.REGRESS_FROM_TERMINAL
    assert decision.record == winner
    assert counter.calls == Counter({"UpdateItem": 1})  # the one-call write missed: no read
    assert store.get(name) == winner


def test_create_race_is_resolved_from_the_returned_item(aws: tuple[Any, str]) -> None:
    client, table = aws
    name = "batches/race-create"
    store = DynamoDBStore(table, client=client)
    rival = DynamoDBStore(table, client=dynamodb_client())
    first = OpRecord(name, State.RUNNING, T0 + 1, 1, "poll", {}, NOW, NOW)
    fired: list[bool] = []

    def race(**_: Any) -> None:
        if not fired:
            fired.append(True)
            assert rival.put_if_absent(first).ok

    client.meta.events.register("before-parameter-build.dynamodb.PutItem", race)
    counter = CallCounter(client)
    decision = ingest(store, ev(name, State.PENDING, T0), sleep=no_sleep)
    assert decision.reason is Reason.LOWER_RANK and decision.record == first
    assert counter.calls == Counter({"PutItem": 1})  # a PENDING event is written as a create


def test_always_losing_on_dynamodb_raises_after_the_bound_and_changes_nothing(
    aws: tuple[Any, str],
) -> None:
    client, table = aws
    name = "batches/lose"
    store = DynamoDBStore(table, client=client)
    assert ingest(store, ev(name, State.RUNNING, T0)).applied
    raw_before = client.get_item(TableName=table, Key={"name": {"S": name}})["Item"]

    def sabotage(params: dict[str, Any], **_: Any) -> None:
        # Every replace expects a version that never exists, so every write loses (the
        # one-call write a rank below any).
        values = params.get("ExpressionAttributeValues")
        if values and ":expected" in values:
            values[":expected"] = {"N": "-1"}
        if values and ":rank" in values:
            values[":rank"] = {"N": "-1"}

    client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", sabotage)
    counter = CallCounter(client)
    sleeps: list[float] = []
    with pytest.raises(IngestContentionError) as info:
        ingest(store, ev(name, State.SUCCEEDED, T0 + 1), max_attempts=5, sleep=sleeps.append)
    assert isinstance(info.value, RetryableError)
    assert info.value.attempts == 5
    assert counter.calls == Counter({"UpdateItem": 6})  # the one-call write, then 5 replaces
    assert len(sleeps) == 4
    assert client.get_item(TableName=table, Key={"name": {"S": name}})["Item"] == raw_before


class AlwaysLosingStore(MemoryStore):
    """Every conditional write loses to a writer that leaves the record as it was."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        self.writes += 1
        return WriteOutcome(ok=False, current=self.get(record.name))

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        self.writes += 1
        return WriteOutcome(ok=False, current=self.get(record.name))


def test_always_losing_store_exhausts_the_bound_and_record_is_unchanged() -> None:
    store = AlwaysLosingStore()
    seeded = OpRecord("batches/x", State.RUNNING, T0, 4, "poll", {"k": 1}, NOW, NOW)
    assert MemoryStore.put_if_absent(store, seeded).ok
    with pytest.raises(IngestContentionError):
        ingest(store, ev("batches/x", State.SUCCEEDED, T0 + 1), sleep=no_sleep)
    assert store.writes == 8  # the default bound
    assert store.get("batches/x") == seeded


# -- faults ------------------------------------------------------------------------------------

THROTTLING_CODES = [
    ("ProvisionedThroughputExceededException", 400),
    ("ThrottlingException", 400),
    ("RequestLimitExceeded", 400),
    ("InternalServerError", 500),
    ("ServiceUnavailable", 503),
    ("ResourceNotFoundException", 400),
]


@pytest.mark.parametrize(("code", "status"), THROTTLING_CODES)
@pytest.mark.parametrize("operation", ["get_item", "put_item", "update_item"])
def test_store_faults_raise_store_unavailable(code: str, status: int, operation: str) -> None:
    client = dynamodb_client(config=Config(retries={"mode": "standard", "max_attempts": 1}))
    store = DynamoDBStore("stubbed", client=client)
    name = "batches/fault"
    # get_item: the store's read (ingest's when it has no record at hand and cannot write first);
    # put_item: a PENDING event's create; update_item: any other event's one-call write.
    state = State.PENDING if operation == "put_item" else State.RUNNING
    with Stubber(client) as stub:
        stub.add_client_error(operation, service_error_code=code, http_status_code=status)
        with pytest.raises(StoreUnavailableError) as info:
            if operation == "get_item":
                store.get(name)
            else:
                ingest(store, ev(name, state, T0), sleep=no_sleep)
        stub.assert_no_pending_responses()
    assert isinstance(info.value, RetryableError)
    assert isinstance(info.value.__cause__, ClientError)


def test_list_open_and_iter_all_faults_raise_store_unavailable() -> None:
    client = dynamodb_client()
    store = DynamoDBStore("stubbed", client=client, shards=1)
    with Stubber(client) as stub:
        stub.add_client_error("query", service_error_code="ThrottlingException")
        stub.add_client_error(
            "scan", service_error_code="InternalServerError", http_status_code=500
        )
        with pytest.raises(StoreUnavailableError):
            store.list_open(10)
        with pytest.raises(StoreUnavailableError):
            list(store.iter_all())


def test_validation_errors_are_permanent_drops_not_outages() -> None:
    """A ValidationException is never retried as an outage (nor answered 500): the state is
    written without details, and if even that is refused the event is dropped, logged."""
    client = dynamodb_client()
    store = DynamoDBStore("stubbed", client=client)
    with Stubber(client) as stub:
        # the one-call write refused: the read-reduce-write does what it does with a refusal
        stub.add_client_error("update_item", service_error_code="ValidationException")
        stub.add_response("get_item", {})
        stub.add_client_error("put_item", service_error_code="ValidationException")
        stub.add_client_error("put_item", service_error_code="ValidationException")
        decision = ingest(store, ev("batches/v", State.RUNNING, T0))
        stub.assert_no_pending_responses()
    assert not decision.applied and decision.reason is Reason.STORE_REJECTED
    with Stubber(client) as stub:
        stub.add_client_error("put_item", service_error_code="ValidationException")
        with pytest.raises(RecordRejectedError) as info:
            store.put_if_absent(OpRecord("batches/v", State.RUNNING, T0, 1, "poll"))
    assert not isinstance(info.value, RetryableError | ClientError)


def test_throttling_event_hook_is_retried_then_surfaces_as_unavailable(
    aws: tuple[Any, str],
) -> None:
    """Standard retry mode retries throttling; when it keeps failing, ingest raises."""
    _, table = aws
    client = dynamodb_client(config=Config(retries={"mode": "standard", "total_max_attempts": 2}))
    attempts: list[str] = []

    def throttle(**kwargs: Any) -> Any:
        from botocore.awsrequest import AWSResponse

        attempts.append("x")
        body = b'{"__type":"ProvisionedThroughputExceededException","message":"slow down"}'
        raw = type("Raw", (), {"stream": lambda self, **k: iter([body])})()
        return AWSResponse("http://x", 400, {"x-amzn-errortype": "x"}, raw)

    client.meta.events.register("before-send.dynamodb.UpdateItem", throttle)
    store = DynamoDBStore(table, client=client)
    with pytest.raises(StoreUnavailableError, match="ProvisionedThroughputExceeded"):
        ingest(store, ev("batches/t", State.RUNNING, T0), sleep=no_sleep)
    assert len(attempts) == 2  # botocore's standard mode retried once before giving up


def test_unreachable_endpoint_raises_store_unavailable() -> None:
    port = free_port()  # nothing listens there
    client = dynamodb_client(
        f"http://127.0.0.1:{port}",
        config=Config(
            retries={"mode": "standard", "max_attempts": 1}, connect_timeout=1, read_timeout=1
        ),
    )
    store = DynamoDBStore("t", client=client)
    with pytest.raises(StoreUnavailableError):
        ingest(store, ev("batches/u", State.RUNNING, T0))


def test_returned_old_item_round_trips_through_the_exception(aws: tuple[Any, str]) -> None:
    """What DynamoDB hands back on a failed condition is the full old item, deserialised."""
    client, table = aws
    record = OpRecord(
        "batches/old", State.RUNNING, T0, 3, "poll", {"a": [1, 2.5, {"b": None}]}, NOW, NOW
    )
    client.put_item(TableName=table, Item=serialize_item(item_from_record(record)))
    store = DynamoDBStore(table, client=client)
    counter = CallCounter(client)
    outcome = store.replace_if_version(record, expected_version=2)
    assert not outcome.ok and outcome.current == record
    assert counter.calls == Counter({"UpdateItem": 1})
