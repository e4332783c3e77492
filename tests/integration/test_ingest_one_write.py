"""One write per applied event on DynamoDB (issue 48): the reducer's rule in the write's
condition (``store.dynamodb_apply``), checked against the reducer itself on moto.

For arbitrary (stored record, event) pairs, two tables start from the same record: one takes
the event by the read-reduce-write (``ingest`` with the record known), the other by
``DynamoDBStore.apply_if_newer``. Whenever the one-call write goes through, both items are
the same (but for ``details_bytes``, an upper bound on the one-call side); whenever it does not,
nothing was written and the stored record came back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from opstate.domain import details as details_rules
from opstate.domain.model import OpEvent, OpRecord, Reason
from opstate.domain.reducer import STATE_SCOPED_KEYS, apply_event
from opstate.domain.states import State
from opstate.ingest import ingest, ingest_counted
from opstate.store.dynamodb import DynamoDBStore
from tests.support.stores import Harness, dynamodb_harness, shared_client

NAME = "batches/one-write"
T0 = 1_778_400_000_000_000_000
NOW = T0 + 3_600 * 10**9

STATES = [
    State.PENDING,
    State.RUNNING,
    State.REQUIRES_ACTION,
    *[State.SUCCEEDED, State.FAILED, State.CANCELLED],
]
KEYS = st.sampled_from(
    ["reason", "error_code", "not_found", "user_metadata", "output_file_uri", "cancelling", "m"]
)
VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=6), st.booleans(), st.none())
DETAILS = st.dictionaries(KEYS, VALUES, max_size=4)


@pytest.fixture(scope="module")
def tables() -> Iterator[tuple[Harness, Harness]]:
    from moto import mock_aws

    with mock_aws():
        client = shared_client()
        yield (
            dynamodb_harness(client, kind="dynamodb-mock"),
            dynamodb_harness(client, kind="dynamodb-mock"),
        )


def _reset(harness: Harness, current: OpRecord | None, *, old_release: bool) -> None:
    harness.client.delete_item(TableName=harness.table, Key={"name": {"S": NAME}})
    if current is None:
        return
    store = harness.store
    assert store.put_if_absent(current).ok
    if old_release:  # a write of the previous release: no details size at this version
        harness.client.update_item(
            TableName=harness.table,
            Key={"name": {"S": NAME}},
            UpdateExpression="REMOVE details_bytes, details_v",
        )


def _comparable(item: dict[str, Any] | None) -> dict[str, Any] | None:
    if item is None:
        return None
    return {k: v for k, v in item.items() if k != "details_bytes"}


@st.composite
def pairs(draw: st.DrawFn) -> tuple[OpRecord | None, OpEvent, bool]:
    event = OpEvent(
        NAME,
        draw(st.sampled_from(STATES)),
        T0 + draw(st.integers(0, 4)),
        draw(st.sampled_from(["report", "poll", "webhook"])),
        draw(DETAILS),
    )
    if draw(st.booleans()) and draw(st.booleans()):
        return None, event, False
    current = OpRecord(
        NAME,
        draw(st.sampled_from(STATES)),
        T0 + draw(st.integers(0, 4)),
        draw(st.integers(1, 5)),
        "report",
        draw(DETAILS),
        created_ns=draw(st.sampled_from([0, T0 - 10])),
        applied_ns=T0 - 5,
    )
    return current, event, draw(st.booleans())


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(pairs())
@example(
    (
        OpRecord(NAME, State.PENDING, T0, 1, "report"),
        OpEvent(NAME, State.RUNNING, T0 + 1, "poll", {}),
        False,
    )
)
def test_the_one_call_write_is_the_reducers_record(
    tables: tuple[Harness, Harness], pair: tuple[OpRecord | None, OpEvent, bool]
) -> None:
    current, event, old_release = pair
    reference, blind = tables
    _reset(reference, current, old_release=old_release)
    _reset(blind, current, old_release=old_release)
    expected = ingest(reference.store, event, clock_ns=lambda: NOW, known=current)
    assert isinstance(blind.store, DynamoDBStore)
    stored = blind.raw(NAME)
    outcome = blind.store.apply_if_newer(event, NOW)
    assert outcome is not None
    after = blind.raw(NAME)
    if outcome.ok:
        assert expected.applied, "written where the reducer drops"
        assert outcome.current == current
        assert _comparable(after) == _comparable(reference.raw(NAME))
        assert after is not None and after["details_bytes"] >= details_rules.size(after["details"])
        assert apply_event(current, event, now_ns=NOW).record == expected.record
    else:
        assert outcome.current == current
        assert after == stored, "a refused write changed the item"


def test_an_advancing_event_is_one_call_that_carries_the_details(
    tables: tuple[Harness, Harness],
) -> None:
    _, blind = tables
    store = blind.store
    _reset(blind, None, old_release=False)
    calls: list[str] = []
    store.client.meta.events.register(
        "before-call.dynamodb", lambda model=None, **_: calls.append(model.name)
    )
    tracked = OpEvent(NAME, State.PENDING, T0, "report", {"user_metadata": {"k": "v"}})
    assert ingest(store, tracked, clock_ns=lambda: NOW).reason is Reason.CREATED
    running = OpEvent(NAME, State.RUNNING, T0 + 1, "poll", {"cancelling": True})
    assert ingest(store, running, clock_ns=lambda: NOW).reason is Reason.ADVANCED
    done = OpEvent(NAME, State.SUCCEEDED, T0 + 2, "webhook", {"output_file_uri": "files/o"})
    decision = ingest_counted(store, done, clock_ns=lambda: NOW + 1)
    assert (decision.decision.reason, decision.attempts) == (Reason.ADVANCED, 1)
    assert calls == ["PutItem", "UpdateItem", "UpdateItem"]
    record = store.get(NAME)
    assert record is not None and record.version == 3 and record.state is State.SUCCEEDED
    # cancelling is state-scoped: the state change took it away, as the reducer does
    assert record.details == {"user_metadata": {"k": "v"}, "output_file_uri": "files/o"}
    item = blind.raw(NAME)
    assert item is not None
    assert "open_shard" not in item and item["archive_queue"].startswith("due#")
    assert item["expires_at"] == (NOW + 1) // 10**9 + 90 * 86_400
    assert not STATE_SCOPED_KEYS & set(record.details)


def test_a_write_of_the_previous_release_leaves_the_size_untrusted(
    tables: tuple[Harness, Harness],
) -> None:
    """The previous release's replace sets the record's attributes it knows and a new version,
    never ``details_v``: the size it leaves behind is not trusted, the event takes the
    read-reduce-write (two calls, no read), and that write makes the size true again."""
    _, blind = tables
    store = blind.store
    _reset(blind, OpRecord(NAME, State.RUNNING, T0, 1, "report", {"a": 1}), old_release=False)
    big = "x" * (details_rules.MAX_DETAILS_BYTES - 100)
    blind.client.update_item(  # what that release's replace_if_version does to the item
        TableName=blind.table,
        Key={"name": {"S": NAME}},
        UpdateExpression="SET version = :v, details = :d, update_ns = :t",
        ExpressionAttributeValues={
            ":v": {"N": "2"},
            ":d": {"M": {"big": {"S": big}}},
            ":t": {"N": str(T0 + 1)},
        },
    )
    assert isinstance(store, DynamoDBStore)
    event = OpEvent(NAME, State.SUCCEEDED, T0 + 2, "webhook", {"output_file_uri": "f" * 200})
    missed = store.apply_if_newer(event, NOW)
    assert missed is not None and not missed.ok and missed.current is not None
    done = ingest_counted(store, event, clock_ns=lambda: NOW)
    assert done.decision.reason is Reason.ADVANCED and done.attempts == 1
    record = store.get(NAME)
    # Over the cap together: the reducer's fit dropped the carried key, which a write trusting
    # the stale size could not have done.
    assert record is not None and record.details == {"output_file_uri": "f" * 200}
    assert done.decision.details_problems
    item = blind.raw(NAME)
    assert item is not None and item["details_v"] == 3
    assert item["details_bytes"] == details_rules.size(record.details)
