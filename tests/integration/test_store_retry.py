"""The retry state beside every record (issue 33), on every store: its own conditional write
(never the record's version, state, details, keys, poll state or archive), kept when ingest
advances the record, the due listing of active roots, the size limit, racing writers, store
faults, and records of the previous release (no retry state) after the upgrade."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.ingest import ingest
from opstate.store.port import ArchiveState, ArchivingStore, RecordRejectedError, RetryingStore
from opstate.store.retry_state import (
    MAX_RETRY_STATE_BYTES,
    RETRY_ACTIVE,
    RETRY_DONE,
    RETRY_MEMBER,
    RETRY_STATUSES,
    RetryState,
)
from opstate.store.sqlite import SQLiteStore
from tests.integration.test_store_polls import LEGACY_ITEM, LEGACY_SCHEMA
from tests.support.stores import STORE_KINDS, Harness, harness_of

S = 1_000_000_000
T0 = parse_time("2026-06-01T10:00:00Z")
NOW_NS = T0 + 3600 * S

ROOT_DOC: dict[str, Any] = {
    "policy": {"maxAttempts": 2, "resubmitExpired": False, "pendingTimeoutHours": None},
    "model": "models/gemini-2.5-flash",
    "input": {"source": "file:///in.jsonl", "location": None, "sha256": "ab", "rows": 3},
    "unavailable": None,
    "stopped": None,
    "children": [],
    "cancelled": [],
    "final": {"status": "pending", "location": None, "retried": 0, "attempts": 1},
}


@pytest.fixture(params=STORE_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_of(request, tmp_path, clock=lambda: NOW_NS) as h:
        yield h


def track(h: Harness, name: str, state: State, t: int, **details: object) -> None:
    ingest(h.store, OpEvent(name, state, t, "report", dict(details)), clock_ns=lambda: NOW_NS)


def retrying(h: Harness) -> RetryingStore:
    assert isinstance(h.store, RetryingStore)
    return h.store


def created(store: RetryingStore, name: str) -> int:
    record = store.get(name)
    assert record is not None
    return record.created_ns


def due(store: RetryingStore, now_ns: int = NOW_NS) -> list[str]:
    return [record.name for record, _ in store.iter_retry_due(now_ns)]


def beside(store: RetryingStore, name: str) -> tuple[object, ...]:
    """Everything stored beside the retry state: the record, its poll state, its archive."""
    poll = store.poll_state(name)  # type: ignore[attr-defined]  # every store here has it
    return (store.get(name), poll, archiving(store).get_archive(name))


def archiving(store: RetryingStore) -> ArchivingStore:
    assert isinstance(store, ArchivingStore)
    return store


def writer(store: RetryingStore, name: str, rev: int, state: RetryState) -> Callable[[], bool]:
    return lambda: store.set_retry(name, rev, state)


# --- RetryState -----------------------------------------------------------------------------


def test_retry_state_round_trips_and_refuses_unknown_statuses() -> None:
    assert RETRY_STATUSES == (RETRY_ACTIVE, RETRY_DONE, RETRY_MEMBER)
    state = RetryState(RETRY_ACTIVE, created_ns=7, rev=2, due_ns=9, doc=ROOT_DOC)
    assert state.as_dict() == {
        "status": "active",
        "created_ns": 7,
        "rev": 2,
        "due_ns": 9,
        "doc": ROOT_DOC,
    }
    assert RetryState.from_dict(state.as_dict()) == state
    with pytest.raises(ValueError, match="unknown retry status"):
        RetryState("waiting")
    # Tolerant of what it reads: missing numbers are 0, an unknown status acts on nothing.
    assert RetryState.from_dict({"status": "bogus", "rev": "x", "doc": [1]}) == RetryState(
        RETRY_DONE
    )
    assert RetryState.from_dict({}) == RetryState(RETRY_DONE)


# --- the conditional write ------------------------------------------------------------------


def test_retry_state_is_its_own_conditional_write(harness: Harness) -> None:
    store = retrying(harness)
    track(harness, "batches/root", State.RUNNING, T0)
    created_ns = created(store, "batches/root")
    assert store.get_retry("batches/root") is None
    assert store.get_retry("batches/none") is None
    untouched = beside(store, "batches/root")
    before_raw = harness.raw("batches/root")
    first = RetryState(RETRY_ACTIVE, created_ns=created_ns, due_ns=NOW_NS, doc=ROOT_DOC)
    # The wrong incarnation, a missing record or a revision that is not the stored one:
    # False, nothing written.
    assert not store.set_retry("batches/root", 0, RetryState(RETRY_ACTIVE, created_ns=1))
    assert not store.set_retry("batches/none", 0, first)
    assert not store.set_retry("batches/root", 1, first)
    assert store.get_retry("batches/root") is None
    assert store.set_retry("batches/root", 0, first)
    stored = store.get_retry("batches/root")
    assert stored == RetryState(
        RETRY_ACTIVE, created_ns=created_ns, rev=1, due_ns=NOW_NS, doc=ROOT_DOC
    )
    # A second writer of revision 0 loses; the stored state is what the winner wrote.
    other = RetryState(RETRY_DONE, created_ns=created_ns, doc={"stopped": "x"})
    assert not store.set_retry("batches/root", 0, other)
    assert not store.set_retry("batches/root", 2, other)
    assert store.get_retry("batches/root") == stored
    child = {"id": "opstate-abc-a1-0", "attempt": 1, "phase": "planned", "rows": 10}
    update = RetryState(
        RETRY_ACTIVE,
        created_ns=created_ns,
        rev=99,  # ignored: the store writes expected_rev + 1
        due_ns=NOW_NS + 60 * S,
        doc={**ROOT_DOC, "children": [child]},
    )
    assert store.set_retry("batches/root", 1, update)
    again = store.get_retry("batches/root")
    assert again is not None and again.rev == 2 and again.doc["children"] == [child]
    assert again.due_ns == NOW_NS + 60 * S
    # The record, its poll state and its archive state never moved.
    assert beside(store, "batches/root") == untouched
    after_raw = harness.raw("batches/root")
    assert before_raw is not None and after_raw is not None
    if harness.kind != "memory":  # every stored attribute / column but the retry ones

        def not_retry(raw: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in raw.items() if not k.startswith("retry")}

        assert not_retry(after_raw) == not_retry(before_raw)


def test_open_and_terminal_records_both_take_a_retry_state(harness: Harness) -> None:
    store = retrying(harness)
    track(harness, "batches/open", State.PENDING, T0)
    track(harness, "batches/done", State.SUCCEEDED, T0, output_file_uri="files/1")
    track(harness, "batches/child", State.CANCELLED, T0)
    for name in ("batches/open", "batches/done"):
        state = RetryState(RETRY_ACTIVE, created_ns=created(store, name), doc=ROOT_DOC)
        assert store.set_retry(name, 0, state)
    lineage = {
        "lineage": {
            "root": "batches/done",
            "parent": "batches/done",
            "attempt": 1,
            "id": "opstate-0123456789ab-a1-0",
        }
    }
    member = RetryState(RETRY_MEMBER, created_ns=created(store, "batches/child"), doc=lineage)
    assert store.set_retry("batches/child", 0, member)
    assert store.get_retry("batches/child") == RetryState(
        RETRY_MEMBER, created_ns=member.created_ns, rev=1, doc=lineage
    )
    assert due(store) == ["batches/done", "batches/open"]  # a member is never listed


def test_ingest_advancing_the_record_keeps_the_retry_state(harness: Harness) -> None:
    store = retrying(harness)
    track(harness, "batches/root", State.PENDING, T0)
    created_ns = created(store, "batches/root")
    state = RetryState(RETRY_ACTIVE, created_ns=created_ns, due_ns=NOW_NS, doc=ROOT_DOC)
    assert store.set_retry("batches/root", 0, state)
    stored = store.get_retry("batches/root")
    track(harness, "batches/root", State.RUNNING, T0 + S)
    track(harness, "batches/root", State.SUCCEEDED, T0 + 2 * S, output_file_uri="files/1")
    track(harness, "batches/root", State.SUCCEEDED, T0 + 3 * S, output_file_uri="files/1")
    record = store.get("batches/root")
    assert record is not None and record.state is State.SUCCEEDED and record.version == 4
    assert record.created_ns == created_ns
    assert store.get_retry("batches/root") == stored
    assert due(store) == ["batches/root"]
    # The archive's own write leaves the retry state alone, and the other way round.
    assert archiving(store).set_archive(
        "batches/root", 0, ArchiveState("archived", created_ns=created_ns, archived_ns=NOW_NS)
    )
    archive = archiving(store).get_archive("batches/root")
    assert store.get_retry("batches/root") == stored
    done = RetryState(RETRY_DONE, created_ns=created_ns, doc={**ROOT_DOC, "final": {}})
    assert store.set_retry("batches/root", 1, done)
    assert archiving(store).get_archive("batches/root") == archive
    assert due(store) == []


def test_due_listing_holds_active_roots_due_soonest_first(harness: Harness) -> None:
    store = retrying(harness)
    names = ["batches/c", "batches/a", "batches/b", "batches/d", "batches/e", "batches/f"]
    for name in names:
        track(harness, name, State.SUCCEEDED, T0)
    track(harness, "batches/none", State.SUCCEEDED, T0)  # no retry state: never listed
    plan = {
        "batches/c": (RETRY_ACTIVE, NOW_NS),
        "batches/a": (RETRY_ACTIVE, NOW_NS),  # same due time as c: by name
        "batches/b": (RETRY_ACTIVE, NOW_NS - 10 * S),
        "batches/d": (RETRY_ACTIVE, NOW_NS + S),  # not due yet
        "batches/e": (RETRY_DONE, 0),
        "batches/f": (RETRY_MEMBER, 0),
    }
    for name, (status, due_ns) in plan.items():
        state = RetryState(status, created_ns=created(store, name), due_ns=due_ns)
        assert store.set_retry(name, 0, state)
    assert due(store) == ["batches/b", "batches/a", "batches/c"]
    assert due(store, NOW_NS + S) == ["batches/b", "batches/a", "batches/c", "batches/d"]
    assert due(store, NOW_NS - 11 * S) == []
    listed = dict(
        (record.name, (record, state)) for record, state in store.iter_retry_due(NOW_NS + S)
    )
    record, state = listed["batches/d"]
    assert record == store.get("batches/d") and state.rev == 1 and state.due_ns == NOW_NS + S
    # Done: off the listing.
    created_b = created(store, "batches/b")
    assert store.set_retry("batches/b", 1, RetryState(RETRY_DONE, created_ns=created_b))
    assert due(store) == ["batches/a", "batches/c"]


def test_a_state_larger_than_the_limit_is_refused_before_the_store(harness: Harness) -> None:
    store = retrying(harness)
    track(harness, "batches/big", State.FAILED, T0)
    created_ns = created(store, "batches/big")
    small = RetryState(RETRY_ACTIVE, created_ns=created_ns, doc=ROOT_DOC)
    assert store.set_retry("batches/big", 0, small)
    stored = store.get_retry("batches/big")
    big = RetryState(RETRY_ACTIVE, created_ns=created_ns, doc={"blob": "x" * MAX_RETRY_STATE_BYTES})
    with pytest.raises(RecordRejectedError, match="larger than"):
        store.set_retry("batches/big", 1, big)
    with pytest.raises(RecordRejectedError, match="no JSON"):
        store.set_retry("batches/big", 1, RetryState(RETRY_ACTIVE, doc={"x": float("nan")}))
    assert store.get_retry("batches/big") == stored
    # Exactly at the limit is written (text counted in UTF-8 bytes), one byte more refused.
    empty = RetryState(RETRY_ACTIVE, created_ns=created_ns, rev=2, doc={"blob": ""})
    room = MAX_RETRY_STATE_BYTES - len(json.dumps(empty.as_dict(), separators=(",", ":")))
    blob = "é" * (room // 4) + "x" * (room - 2 * (room // 4))
    over = RetryState(RETRY_ACTIVE, created_ns=created_ns, doc={"blob": blob + "x"})
    with pytest.raises(RecordRejectedError, match="larger than"):
        store.set_retry("batches/big", 1, over)
    fits = RetryState(RETRY_ACTIVE, created_ns=created_ns, doc={"blob": blob})
    assert store.set_retry("batches/big", 1, fits)
    assert store.get_retry("batches/big") == RetryState(
        RETRY_ACTIVE, created_ns=created_ns, rev=2, doc=fits.doc
    )


def race(writers: list[Callable[[], bool]]) -> list[bool]:
    """Run ``writers`` at once (a barrier), their results in order."""
    barrier = threading.Barrier(len(writers))
    results: list[bool] = [False] * len(writers)

    def run(index: int) -> None:
        barrier.wait()
        results[index] = writers[index]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(writers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_racing_writers_of_one_revision_one_wins(harness: Harness) -> None:
    if harness.kind == "dynamodb-mock":
        # moto's in-process backend checks a condition and writes with no lock between them;
        # the server kind (tests/support/moto_atomic.py) is atomic, as DynamoDB is.
        pytest.skip("moto in-process: conditional writes are not atomic")
    store = retrying(harness)
    track(harness, "batches/race", State.RUNNING, T0)
    created_ns = created(store, "batches/race")
    for rev in range(5):
        states = [
            RetryState(RETRY_ACTIVE, created_ns=created_ns, doc={"writer": i, "rev": rev})
            for i in range(4)
        ]
        results = race([writer(store, "batches/race", rev, s) for s in states])
        assert results.count(True) == 1
        stored = store.get_retry("batches/race")
        assert stored is not None and stored.rev == rev + 1
        assert stored.doc == states[results.index(True)].doc


def test_two_sqlite_connections_racing_on_one_revision_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    first, second = SQLiteStore(path), SQLiteStore(path)
    try:
        ingest(
            first, OpEvent("batches/r", State.RUNNING, T0, "report", {}), clock_ns=lambda: NOW_NS
        )
        created_ns = created(first, "batches/r")
        for rev in range(10):
            a = RetryState(RETRY_ACTIVE, created_ns=created_ns, doc={"by": "first"})
            b = RetryState(RETRY_ACTIVE, created_ns=created_ns, doc={"by": "second"})
            results = race(
                [
                    writer(first, "batches/r", rev, a),
                    writer(second, "batches/r", rev, b),
                ]
            )
            assert results.count(True) == 1
            stored = second.get_retry("batches/r")
            assert stored is not None and stored.rev == rev + 1
            assert stored.doc == (a if results[0] else b).doc
    finally:
        first.close()
        second.close()


def test_a_locked_sqlite_file_is_a_store_fault(tmp_path: Path) -> None:
    from opstate.store.port import StoreUnavailableError

    path = tmp_path / "locked.db"
    store = SQLiteStore(path, busy_timeout_s=0.05)
    try:
        ingest(
            store, OpEvent("batches/l", State.RUNNING, T0, "report", {}), clock_ns=lambda: NOW_NS
        )
        state = RetryState(RETRY_ACTIVE, created_ns=created(store, "batches/l"))
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(StoreUnavailableError):
                store.set_retry("batches/l", 0, state)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.get_retry("batches/l") is None
        assert store.set_retry("batches/l", 0, state)
    finally:
        store.close()


# --- records written by the previous release ------------------------------------------------

# The previous release's file: its schema plus the poll and archive columns it added on open.
PREVIOUS_COLUMNS = """
ALTER TABLE operations ADD COLUMN poll_misses INTEGER NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN poll_missing_since_ns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN lost_ns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN overdue_ns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN archive TEXT;
ALTER TABLE operations ADD COLUMN archive_status TEXT;
ALTER TABLE operations ADD COLUMN archive_rev INTEGER NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN archive_due_ns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN progress TEXT;
"""


def test_a_sqlite_file_of_the_previous_release_gets_the_retry_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_SCHEMA + PREVIOUS_COLUMNS)
    row = ("SUCCEEDED", 3, f"{T0:021d}", 3, "batch", "poll", "{}", T0 - S, T0)
    conn.execute(
        "INSERT INTO operations (name, state, rank, update_ns, version, kind, source, details, "
        "created_ns, applied_ns, open_ns, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ("batches/old", *row, None, T0 // S + 90 * 86400),
    )
    conn.execute(
        "INSERT INTO operations (name, state, rank, update_ns, version, kind, source, details, "
        "created_ns, applied_ns, open_ns, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ("batches/old-open", "RUNNING", 1, *row[2:], f"{T0:021d}", None),
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    try:
        columns = {r[1] for r in store._conn().execute("PRAGMA table_info(operations)")}
        assert {"retry", "retry_status", "retry_rev", "retry_due_ns"} <= columns
        indexes = {r[1] for r in store._conn().execute("PRAGMA index_list(operations)")}
        assert "operations_retry" in indexes
        assert store.get_retry("batches/old") is None
        assert store.get_retry("batches/old-open") is None
        assert due(store) == []
        record = store.get("batches/old")
        assert record is not None and record.version == 3
        state = RetryState(RETRY_ACTIVE, created_ns=T0 - S, due_ns=NOW_NS, doc=ROOT_DOC)
        assert store.set_retry("batches/old", 0, state)
        assert store.set_retry("batches/old-open", 0, state)
        assert due(store) == ["batches/old", "batches/old-open"]
        assert store.get("batches/old") == record
        # Opened again (the columns and the index exist now): nothing changes.
        store.close()
        again = SQLiteStore(path)
        try:
            stored = again.get_retry("batches/old")
            assert stored is not None and stored.rev == 1 and stored.doc == ROOT_DOC
        finally:
            again.close()
    finally:
        store.close()


def legacy_item(name: str, state: str, **extra: dict[str, str]) -> dict[str, Any]:
    """An item as the previous release's DynamoDBStore wrote it (no retry attributes)."""
    item: dict[str, Any] = {
        k: v for k, v in LEGACY_ITEM.items() if k not in ("open_shard", "open_update_ns")
    }
    item.update(name={"S": name}, state={"S": state}, **extra)
    return item


def test_dynamodb_items_of_the_previous_release_take_a_retry_state() -> None:
    from moto import mock_aws

    from tests.support.stores import dynamodb_harness, shared_client

    with mock_aws():
        h = dynamodb_harness(shared_client(), kind="dynamodb-mock", shards=1)
        store = retrying(h)
        done = legacy_item(
            "batches/old",
            "SUCCEEDED",
            rank={"N": "2"},
            expires_at={"N": str(T0 // S + 90 * 86400)},
            archive_status={"S": "archived"},
            archive_rev={"N": "1"},
            archive_queue={"S": "done"},
        )
        running = legacy_item(
            "batches/old-open", "RUNNING", open_shard={"N": "0"}, open_update_ns={"N": str(T0)}
        )
        for item in (done, running):
            h.client.put_item(TableName=h.table, Item=item)
        assert store.get_retry("batches/old") is None
        assert store.get_retry("batches/old-open") is None
        assert due(store) == []
        created_ns = T0 - 600 * S  # LEGACY_ITEM["created_ns"]
        record = store.get("batches/old")
        assert record is not None and record.created_ns == created_ns
        state = RetryState(RETRY_ACTIVE, created_ns=created_ns, due_ns=NOW_NS, doc=ROOT_DOC)
        assert not store.set_retry("batches/old", 1, state)  # no revision yet: 0 is expected
        assert store.set_retry("batches/old", 0, state)
        assert store.set_retry("batches/old-open", 0, state)
        assert due(store) == ["batches/old", "batches/old-open"]
        raw = h.raw("batches/old")
        assert raw is not None
        assert raw["retry_status"] == "active" and raw["retry_rev"] == 1
        assert raw["retry_due_ns"] == NOW_NS and raw["retry"]["doc"] == ROOT_DOC
        assert store.get("batches/old") == record
        # The old item's archive and the open item's poll state are as they were.
        assert raw["archive_status"] == "archived" and raw["archive_queue"] == "done"
        raw_open = h.raw("batches/old-open")
        assert raw_open is not None and raw_open["open_update_ns"] == T0
        # Ingest advancing the old open item keeps its retry state.
        track(h, "batches/old-open", State.SUCCEEDED, T0 + S)
        assert store.get_retry("batches/old-open") == store.get_retry("batches/old")


def count_calls(client: Any, operation: str) -> tuple[list[dict[str, Any]], Callable[[], None]]:
    """The parameters of every ``operation`` call ``client`` makes from now on, and the undo."""
    calls: list[dict[str, Any]] = []
    event = f"provide-client-params.dynamodb.{operation}"

    def seen(params: dict[str, Any], **_: Any) -> None:
        calls.append(params)

    client.meta.events.register(event, seen)
    return calls, lambda: client.meta.events.unregister(event, seen)


def test_dynamodb_due_listing_queries_the_retry_index_and_never_scans() -> None:
    """Only active roots carry ``retry_queue`` (the sparse GSI's key): set_retry writes it for
    an active state and removes it otherwise, in the same UpdateItem; the listing is one
    Query per queue shard on retry-index, no Scan."""
    from moto import mock_aws

    from opstate.store.dynamodb_items import RETRY_INDEX, RETRY_QUEUE_SHARDS, retry_queue_of
    from tests.support.stores import dynamodb_client, dynamodb_harness

    with mock_aws():
        h = dynamodb_harness(dynamodb_client(), kind="dynamodb-mock", shards=2)
        store = retrying(h)
        names = ["batches/x", "batches/y", "batches/later", "batches/member"]
        for name in names:
            track(h, name, State.RUNNING, T0)
        for name, status, due_ns in (
            ("batches/x", RETRY_ACTIVE, NOW_NS),
            ("batches/y", RETRY_ACTIVE, NOW_NS - S),
            ("batches/later", RETRY_ACTIVE, NOW_NS + S),
            ("batches/member", RETRY_MEMBER, 0),
        ):
            state = RetryState(status, created_ns=created(store, name), due_ns=due_ns)
            assert store.set_retry(name, 0, state)
        raw = {name: h.raw(name) or {} for name in names}
        assert raw["batches/x"]["retry_queue"] == retry_queue_of("batches/x")
        assert raw["batches/x"]["retry_queue"].startswith("active#")
        assert "retry_queue" not in raw["batches/member"]
        scans, unscan = count_calls(h.client, "Scan")
        queries, unquery = count_calls(h.client, "Query")
        try:
            assert due(store) == ["batches/y", "batches/x"]
            assert due(store, NOW_NS + S) == ["batches/y", "batches/x", "batches/later"]
            # Done: out of the index (its queue key removed by the same write).
            done = RetryState(RETRY_DONE, created_ns=created(store, "batches/y"))
            assert store.set_retry("batches/y", 1, done)
            assert "retry_queue" not in (h.raw("batches/y") or {})
            assert due(store) == ["batches/x"]
            # Active again: back in it.
            again = RetryState(RETRY_ACTIVE, created_ns=created(store, "batches/y"), due_ns=0)
            assert store.set_retry("batches/y", 2, again)
            assert due(store) == ["batches/y", "batches/x"]
        finally:
            unscan()
            unquery()
        assert scans == []
        assert len(queries) == 4 * RETRY_QUEUE_SHARDS
        assert {q["IndexName"] for q in queries} == {RETRY_INDEX}
        assert {q["ExpressionAttributeValues"][":queue"]["S"] for q in queries} == {
            f"active#{k}" for k in range(RETRY_QUEUE_SHARDS)
        }
        assert all("ConsistentRead" not in q for q in queries)  # a GSI is eventually consistent


def test_dynamodb_table_without_the_retry_index_is_scanned() -> None:
    """The previous release's table (no retry-index until ``sam deploy`` adds it): the listing
    is the filtered, consistent Scan, and each listing tries the index again."""
    from moto import mock_aws

    from opstate.store.dynamodb import DynamoDBStore
    from tests.support.stores import dynamodb_client, unique_table
    from tests.support.template import table_properties

    with mock_aws():
        client = dynamodb_client()
        props = table_properties()
        table = unique_table()
        client.create_table(
            TableName=table,
            AttributeDefinitions=[
                a
                for a in props["AttributeDefinitions"]
                if not a["AttributeName"].startswith("retry")
            ],
            KeySchema=props["KeySchema"],
            BillingMode="PAY_PER_REQUEST",
            GlobalSecondaryIndexes=[
                g for g in props["GlobalSecondaryIndexes"] if g["IndexName"] != "retry-index"
            ],
        )
        store = DynamoDBStore(table, client=client, clock=lambda: NOW_NS)
        h = Harness("dynamodb-mock", store, lambda _: None, client=client, table=table)
        for name in ("batches/b", "batches/a"):
            track(h, name, State.SUCCEEDED, T0)
            state = RetryState(RETRY_ACTIVE, created_ns=created(store, name), due_ns=NOW_NS)
            assert store.set_retry(name, 0, state)
        scans, unscan = count_calls(client, "Scan")
        queries, unquery = count_calls(client, "Query")
        try:
            assert due(store) == ["batches/a", "batches/b"]
            assert due(store, NOW_NS - S) == []
        finally:
            unscan()
            unquery()
        assert len(scans) == 2 and len(queries) == 2  # the index tried again on each listing
        assert all(scan["ConsistentRead"] is True for scan in scans)


@pytest.mark.parametrize(
    "message",
    [
        "Cannot read from backfilling global secondary index: retry-index",
        "The table does not have the specified index: retry-index",
    ],
)
def test_dynamodb_scans_while_the_retry_index_is_missing_or_building(
    monkeypatch: pytest.MonkeyPatch, message: str
) -> None:
    """DynamoDB refuses a Query on an index it is still building, or does not have, with a
    ValidationException: the listing is the Scan; any other refusal is a bug, raised."""
    from botocore.exceptions import ClientError
    from moto import mock_aws

    from tests.support.stores import dynamodb_client, dynamodb_harness

    with mock_aws():
        h = dynamodb_harness(dynamodb_client(), kind="dynamodb-mock", shards=1)
        store = retrying(h)
        track(h, "batches/r", State.SUCCEEDED, T0)
        state = RetryState(RETRY_ACTIVE, created_ns=created(store, "batches/r"), due_ns=NOW_NS)
        assert store.set_retry("batches/r", 0, state)

        def refused(text: str) -> Callable[..., None]:
            def query(**_: object) -> None:
                error = {"Code": "ValidationException", "Message": text}
                raise ClientError({"Error": error}, "Query")

            return query

        monkeypatch.setattr(h.client, "query", refused(message))
        assert due(store) == ["batches/r"]
        monkeypatch.setattr(h.client, "query", refused("x"))
        with pytest.raises(ClientError):
            due(store)


FAULTS = [
    ("ProvisionedThroughputExceededException", 400),
    ("ThrottlingException", 400),
    ("InternalServerError", 500),
]


@pytest.mark.parametrize(("code", "status"), FAULTS)
@pytest.mark.parametrize("call", ["get_retry", "set_retry", "iter_retry_due"])
def test_dynamodb_store_faults_raise_store_unavailable(code: str, status: int, call: str) -> None:
    from botocore.config import Config
    from botocore.stub import Stubber

    from opstate.store.dynamodb import DynamoDBStore
    from opstate.store.port import StoreUnavailableError
    from tests.support.stores import dynamodb_client

    client = dynamodb_client(config=Config(retries={"mode": "standard", "max_attempts": 1}))
    store = DynamoDBStore("stubbed", client=client)
    operation = {"get_retry": "get_item", "set_retry": "update_item", "iter_retry_due": "query"}
    state = RetryState(RETRY_ACTIVE, created_ns=T0)
    with Stubber(client) as stub:
        stub.add_client_error(operation[call], service_error_code=code, http_status_code=status)
        with pytest.raises(StoreUnavailableError):
            if call == "get_retry":
                store.get_retry("batches/f")
            elif call == "set_retry":
                store.set_retry("batches/f", 0, state)
            else:
                list(store.iter_retry_due(NOW_NS))


def test_dynamodb_refusing_the_item_is_a_permanent_refusal() -> None:
    from botocore.stub import Stubber

    from opstate.store.dynamodb import DynamoDBStore
    from tests.support.stores import dynamodb_client

    client = dynamodb_client()
    store = DynamoDBStore("stubbed", client=client)
    with Stubber(client) as stub:
        stub.add_client_error(
            "update_item",
            service_error_code="ValidationException",
            service_message="Item size has exceeded the maximum allowed size",
        )
        with pytest.raises(RecordRejectedError, match="maximum allowed size"):
            store.set_retry("batches/f", 0, RetryState(RETRY_ACTIVE, created_ns=T0))
