"""One contract, every store: DynamoDB (moto in-process and moto server), SQLite, memory."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.domain.model import OpEvent, OpRecord, Reason
from opstate.domain.states import State
from opstate.domain.times import MAX_NS, NS_PER_SECOND, parse_time
from opstate.ingest import ingest
from opstate.store.dynamodb import shard_of
from tests.support.stores import STORE_KINDS, Harness, harness_of

NOW_NS = parse_time("2026-06-01T12:00:00.123456789Z")
RETENTION_DAYS = 30
T0 = parse_time("2026-06-01T10:00:00Z")


@pytest.fixture(params=STORE_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_of(request, tmp_path, retention_days=RETENTION_DAYS, clock=lambda: NOW_NS) as h:
        yield h


def ev(
    name: str, state: State, t: int, details: dict[str, Any] | None = None, source: str = "poll"
) -> OpEvent:
    return OpEvent(name, state, t, source, details or {})


def run(h: Harness, event: OpEvent, now_ns: int = NOW_NS) -> Any:
    return ingest(h.store, event, clock_ns=lambda: now_ns)


def is_dynamodb(h: Harness) -> bool:
    return h.kind.startswith("dynamodb")


# -- basic port behaviour ----------------------------------------------------------------------


def test_missing_record_reads_as_none(harness: Harness) -> None:
    assert harness.store.get("batches/nope") is None
    assert harness.raw("batches/nope") is None


def test_create_stores_the_event_as_version_one(harness: Harness) -> None:
    details = {
        "user_metadata": {"team": "a", "nested": {"list": [1, 2.5, "x", None, True]}},
        "ratio": 0.1,
        "count": 3,
        "flag": False,
        "empty": "",
    }
    decision = run(harness, ev("batches/c1", State.PENDING, T0, details))
    assert decision.applied and decision.reason is Reason.CREATED
    record = harness.store.get("batches/c1")
    assert record == OpRecord("batches/c1", State.PENDING, T0, 1, "poll", details, NOW_NS, NOW_NS)
    assert isinstance(record.details["count"], int)
    assert isinstance(record.details["ratio"], float)
    assert record == decision.record


def test_advance_and_refresh_increment_version_once_each(harness: Harness) -> None:
    name = "batches/adv"
    run(harness, ev(name, State.PENDING, T0))
    advanced = run(harness, ev(name, State.RUNNING, T0 + 1, {"a": 1}), now_ns=NOW_NS + 5)
    assert advanced.reason is Reason.ADVANCED and advanced.state_changed
    refreshed = run(harness, ev(name, State.RUNNING, T0 + 2, {"b": 2}), now_ns=NOW_NS + 9)
    assert refreshed.reason is Reason.REFRESHED and not refreshed.state_changed
    record = harness.store.get(name)
    assert record is not None
    assert (record.state, record.update_time_ns, record.version) == (State.RUNNING, T0 + 2, 3)
    assert record.details == {"a": 1, "b": 2}
    assert (record.created_ns, record.applied_ns) == (NOW_NS, NOW_NS + 9)


@pytest.mark.parametrize(
    ("setup", "event", "reason"),
    [
        (
            [(State.SUCCEEDED, 10)],
            (State.RUNNING, 20),
            Reason.REGRESS_FROM_TERMINAL,
        ),
        ([(State.SUCCEEDED, 10)], (State.FAILED, 20), Reason.TERMINAL_CONFLICT),
        ([(State.RUNNING, 10)], (State.PENDING, 20), Reason.LOWER_RANK),
        ([(State.RUNNING, 10)], (State.RUNNING, 10), Reason.STALE_OR_EQUAL_UPDATE_TIME),
        ([(State.RUNNING, 10)], (State.REQUIRES_ACTION, 5), Reason.STALE_OR_EQUAL_UPDATE_TIME),
        ([(State.SUCCEEDED, 10)], (State.SUCCEEDED, 10), Reason.STALE_OR_EQUAL_UPDATE_TIME),
    ],
    ids=["regress-from-terminal", "terminal-conflict", "lower-rank", "equal-time", "stale", "dup"],
)
def test_every_drop_reason_writes_nothing(
    harness: Harness,
    setup: list[tuple[State, int]],
    event: tuple[State, int],
    reason: Reason,
) -> None:
    name = "batches/drop"
    for state, t in setup:
        run(harness, ev(name, state, T0 + t, {"keep": True}))
    before_raw = harness.raw(name)
    before = harness.store.get(name)
    decision = run(harness, ev(name, event[0], T0 + event[1], {"junk": 1}), now_ns=NOW_NS + 99)
    assert not decision.applied
    assert decision.reason is reason
    assert decision.record == before
    assert harness.store.get(name) == before
    assert harness.raw(name) == before_raw


def test_version_counts_applied_decisions_exactly(harness: Harness) -> None:
    name = "batches/ver"
    timeline = [
        ev(name, State.PENDING, T0),
        ev(name, State.RUNNING, T0 + 1),
        ev(name, State.RUNNING, T0 + 2),
        ev(name, State.REQUIRES_ACTION, T0 + 3),
        ev(name, State.RUNNING, T0 + 4),
        ev(name, State.SUCCEEDED, T0 + 5),
    ]
    deliveries = timeline * 2
    random.Random(7).shuffle(deliveries)
    applied = 0
    for event in deliveries:
        decision = run(harness, event)
        applied += decision.applied
        current = harness.store.get(name)
        assert current is not None and current.version == applied
    record = harness.store.get(name)
    assert record is not None
    assert (record.state, record.update_time_ns) == (State.SUCCEEDED, T0 + 5)


# -- conditional writes ------------------------------------------------------------------------


def test_put_if_absent_conflict_returns_the_winner(harness: Harness) -> None:
    winner = OpRecord("batches/w", State.RUNNING, T0, 1, "webhook", {"w": 1}, NOW_NS, NOW_NS)
    loser = OpRecord("batches/w", State.PENDING, T0 - 1, 1, "poll", {}, NOW_NS, NOW_NS)
    assert harness.store.put_if_absent(winner).ok
    outcome = harness.store.put_if_absent(loser)
    assert not outcome.ok
    assert outcome.current == winner
    assert harness.store.get("batches/w") == winner


def test_replace_if_version_conflict_returns_the_winner(harness: Harness) -> None:
    v1 = OpRecord("batches/r", State.PENDING, T0, 1, "poll", {}, NOW_NS, NOW_NS)
    v2 = OpRecord("batches/r", State.RUNNING, T0 + 1, 2, "poll", {"x": 1}, NOW_NS, NOW_NS + 1)
    stale = OpRecord("batches/r", State.RUNNING, T0 + 5, 2, "webhook", {}, NOW_NS, NOW_NS + 2)
    assert harness.store.put_if_absent(v1).ok
    assert harness.store.replace_if_version(v2, expected_version=1).ok
    outcome = harness.store.replace_if_version(stale, expected_version=1)
    assert not outcome.ok
    assert outcome.current == v2
    assert harness.store.get("batches/r") == v2


def test_replace_of_a_missing_record_fails_with_no_current(harness: Harness) -> None:
    record = OpRecord("batches/ghost", State.RUNNING, T0, 2, "poll", {}, NOW_NS, NOW_NS)
    outcome = harness.store.replace_if_version(record, expected_version=1)
    assert not outcome.ok
    assert outcome.current is None
    assert harness.store.get("batches/ghost") is None


# -- the open listing and TTL ------------------------------------------------------------------


def test_open_listing_follows_terminal_state(harness: Harness) -> None:
    name = "batches/open"
    run(harness, ev(name, State.RUNNING, T0))
    assert [r.name for r in harness.store.list_open(10)] == [name]
    raw = harness.raw(name)
    assert raw is not None
    if is_dynamodb(harness):
        assert raw["open_shard"] == shard_of(name, 4)
        assert raw["open_update_ns"] == T0
        assert "expires_at" not in raw
    elif harness.kind == "sqlite":
        assert raw["open_ns"] is not None and raw["expires_at"] is None
    run(harness, ev(name, State.FAILED, T0 + 1, {"error_code": 13}))
    assert harness.store.list_open(10) == []
    raw = harness.raw(name)
    assert raw is not None
    if is_dynamodb(harness):
        assert "open_shard" not in raw and "open_update_ns" not in raw
    elif harness.kind == "sqlite":
        assert raw["open_ns"] is None


def test_terminal_records_carry_expires_at(harness: Harness) -> None:
    if harness.kind == "memory":
        pytest.skip("the memory store keeps no TTL")
    name = "batches/ttl"
    applied = NOW_NS + 7 * NS_PER_SECOND
    run(harness, ev(name, State.SUCCEEDED, T0), now_ns=applied)
    raw = harness.raw(name)
    assert raw is not None
    assert raw["expires_at"] == applied // NS_PER_SECOND + RETENTION_DAYS * 86_400
    if is_dynamodb(harness):
        assert raw["state"] == "SUCCEEDED" and raw["rank"] == 2 and raw["kind"] == "batch"
        assert raw["update_time"] == "2026-06-01T10:00:00.000000000Z"
        assert raw["applied_at"] == "2026-06-01T12:00:07.123456789Z"
        assert raw["created_at"] == "2026-06-01T12:00:07.123456789Z"
        assert raw["version"] == 1 and raw["update_ns"] == T0


def test_open_listing_is_oldest_first_across_shards(harness: Harness) -> None:
    rng = random.Random(3)
    times = rng.sample(range(1, 10_000), 24)
    names = [f"batches/o{i:02d}" for i in range(24)]
    for name, t in zip(names, times, strict=True):
        run(harness, ev(name, State.PENDING if t % 2 else State.RUNNING, T0 + t))
    run(harness, ev("batches/done", State.CANCELLED, T0))
    assert len({shard_of(n, 4) for n in names}) == 4  # the names really span every shard
    expected = [n for _, n in sorted(zip(times, names, strict=True))]
    listed = harness.store.list_open(100)
    assert [r.name for r in listed] == expected
    assert [r.name for r in harness.store.list_open(5)] == expected[:5]
    assert harness.store.list_open(0) == []


def test_iter_all_lists_every_record(harness: Harness) -> None:
    names = {f"batches/all{i}" for i in range(7)}
    for i, name in enumerate(sorted(names)):
        run(harness, ev(name, State.SUCCEEDED if i % 2 else State.RUNNING, T0 + i))
    records = list(harness.store.iter_all())
    assert {r.name for r in records} == names
    assert all(r.version == 1 for r in records)


def test_extreme_times_round_trip(harness: Harness) -> None:
    run(harness, ev("batches/zero", State.RUNNING, 0))
    run(harness, ev("batches/max", State.RUNNING, MAX_NS))
    zero, last = harness.store.get("batches/zero"), harness.store.get("batches/max")
    assert zero is not None and zero.update_time_ns == 0
    assert last is not None and last.update_time_ns == MAX_NS
    assert [r.name for r in harness.store.list_open(10)] == ["batches/zero", "batches/max"]
    if is_dynamodb(harness):
        raw = harness.raw("batches/zero")
        assert raw is not None and "update_time" not in raw


def test_store_from_url_reaches_the_endpoint_named_in_the_environment(
    moto_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """boto3 keeps honouring AWS_ENDPOINT_URL_DYNAMODB: nothing in the store overrides it."""
    from opstate.store import store_from_url
    from tests.support.stores import shared_client, unique_table
    from tests.support.template import create_table_from_template

    table = unique_table()
    create_table_from_template(shared_client(moto_server.endpoint), table)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", moto_server.endpoint)
    store = store_from_url(f"dynamodb://{table}")
    try:
        assert ingest(store, ev("batches/env", State.RUNNING, T0)).applied
        seen = shared_client(moto_server.endpoint).get_item(
            TableName=table, Key={"name": {"S": "batches/env"}}
        )
        assert seen["Item"]["state"] == {"S": "RUNNING"}
    finally:
        store.close()
        shared_client(moto_server.endpoint).delete_table(TableName=table)


# -- store-specific behaviour ------------------------------------------------------------------


def test_sqlite_write_lock_held_elsewhere_is_store_unavailable(tmp_path: Path) -> None:
    import sqlite3

    from opstate.store import StoreUnavailableError
    from opstate.store.sqlite import SQLiteStore

    path = tmp_path / "locked.db"
    store = SQLiteStore(path, busy_timeout_s=0.05)
    assert ingest(store, ev("batches/l", State.PENDING, T0)).applied
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with pytest.raises(StoreUnavailableError, match="locked"):
            ingest(store, ev("batches/l", State.RUNNING, T0 + 1))
        record = store.get("batches/l")  # WAL: readers are not blocked by the writer
        assert record is not None and record.version == 1
        other.execute("ROLLBACK")
        assert ingest(store, ev("batches/l", State.RUNNING, T0 + 1)).applied
    finally:
        other.close()
        store.close()


def test_sqlite_uses_wal_and_one_connection_per_thread(tmp_path: Path) -> None:
    import sqlite3
    import threading

    from opstate.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "wal.db")
    try:
        assert ingest(store, ev("batches/w", State.PENDING, T0)).applied
        mode = store._conn().execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"
        seen: list[sqlite3.Connection] = []

        def work() -> None:
            assert store.get("batches/w") is not None
            seen.append(store._conn())

        threads = [threading.Thread(target=work) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len({id(c) for c in seen} | {id(store._conn())}) == 4
        store.close()
        for conn in seen:  # close() closed every thread's connection
            with pytest.raises(sqlite3.ProgrammingError):
                conn.execute("SELECT 1")
        store.close()  # idempotent
        assert store.get("batches/w") is not None  # and the store reopens on use
    finally:
        store.close()


def test_sqlite_purges_expired_terminal_records(tmp_path: Path) -> None:
    from opstate.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "ttl.db", retention_days=1)
    try:
        ingest(store, ev("batches/done", State.SUCCEEDED, T0), clock_ns=lambda: NOW_NS)
        ingest(store, ev("batches/open", State.RUNNING, T0), clock_ns=lambda: NOW_NS)
        now_s = NOW_NS // NS_PER_SECOND
        assert store.purge_expired(now_s + 86_399) == 0
        assert store.purge_expired(now_s + 86_400) == 1
        assert store.get("batches/done") is None and store.get("batches/open") is not None
    finally:
        store.close()


def test_dynamodb_item_helpers_round_trip_details() -> None:
    from decimal import Decimal

    from opstate.store.dynamodb import (
        deserialize_item,
        item_from_record,
        record_from_item,
        record_from_wire,
        serialize_item,
    )

    details = {"f": 0.1, "i": 12, "big": 10**20, "l": [1.5, {"m": None}], "s": "", "b": True}
    record = OpRecord("batches/h", State.RUNNING, T0, 3, "poll", details, NOW_NS, NOW_NS)
    item = item_from_record(record, shards=8, retention_days=5)
    assert item["open_shard"] == shard_of("batches/h", 8) and "expires_at" not in item
    wire = serialize_item(item)
    assert wire["details"]["M"]["f"] == {"N": "0.1"}
    assert record_from_wire(wire) == record
    # A stream image as Powertools/TypeDeserializer hands it over: numbers as Decimal.
    image = deserialize_item(wire)
    assert image["version"] == Decimal(3)
    assert record_from_item(image) == record
    odd = item_from_record(
        OpRecord("batches/n", State.FAILED, T0, 1, "poll", {"x": float("nan")}, NOW_NS, NOW_NS)
    )
    assert serialize_item(odd)["details"]["M"]["x"] == {"S": "NaN"}
    assert odd["expires_at"] == NOW_NS // NS_PER_SECOND + 90 * 86_400
