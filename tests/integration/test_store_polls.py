"""The poll state beside each record, on every store: the due-ordered open index, set_poll,
what ingest writes keep or clear, lost leaving the index; and records of the previous release
(no poll state, open key = update time) polled to the end after the upgrade."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from opstate.config import Settings
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.domain.views import PROGRESS_DETAIL
from opstate.ingest import ingest
from opstate.reconcile.run import reconcile_once
from opstate.store import PollState
from opstate.store.dynamodb import DynamoDBStore
from opstate.store.sqlite import SQLiteStore
from tests.support.clock import FakeClock
from tests.support.gemini_memory import MemoryGateway
from tests.support.stores import STORE_KINDS, Harness, harness_of

S = 1_000_000_000
T0 = parse_time("2026-06-01T10:00:00Z")
NOW_NS = T0 + 3600 * S
SETTINGS = Settings(store_url="memory://", reconcile_workers=2, reconcile_max_pages=0)


@pytest.fixture(params=STORE_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_of(request, tmp_path, clock=lambda: NOW_NS) as h:
        yield h


def track(h: Harness, name: str, state: State, t: int) -> None:
    ingest(h.store, OpEvent(name, state, t, "report", {}), clock_ns=lambda: NOW_NS)


def due_names(h: Harness, now_ns: int | None, page_size: int = 100) -> list[str]:
    return [e.record.name for e in h.store.iter_due(now_ns, page_size)]  # type: ignore[attr-defined]


def test_open_index_is_due_ordered_paged_and_bounded_by_now(harness: Harness) -> None:
    names = [f"batches/op{i:02d}" for i in range(23)]
    for i, name in enumerate(names):
        track(harness, name, State.RUNNING, T0 + i * S)
    track(harness, "batches/done", State.SUCCEEDED, T0)
    # New records are due at their update time: oldest first, across shards, page by page.
    assert due_names(harness, NOW_NS, page_size=4) == names
    assert due_names(harness, T0 + 5 * S, page_size=4) == names[:6]
    store = harness.store
    later = PollState(due_ns=NOW_NS + 600 * S)
    assert store.set_poll("batches/op00", 1, later)  # type: ignore[attr-defined]
    assert due_names(harness, NOW_NS, page_size=4) == names[1:]
    assert due_names(harness, None)[-1] == "batches/op00"
    # Wrong version, terminal record: nothing written.
    assert not store.set_poll("batches/op01", 7, later)  # type: ignore[attr-defined]
    assert not store.set_poll("batches/done", 1, later)  # type: ignore[attr-defined]


def test_ingest_keeps_due_and_overdue_clears_streak_and_lost_rejoins(harness: Harness) -> None:
    store = harness.store
    track(harness, "batches/a", State.PENDING, T0)
    poll = PollState(
        due_ns=NOW_NS + 900 * S, misses=2, missing_since_ns=T0, lost_ns=0, overdue_ns=NOW_NS
    )
    assert store.set_poll("batches/a", 1, poll)  # type: ignore[attr-defined]
    track(harness, "batches/a", State.RUNNING, T0 + S)  # a real observation (version 2)
    (entry,) = list(store.iter_due(None))  # type: ignore[attr-defined]
    assert entry.record.version == 2 and entry.record.state is State.RUNNING
    assert entry.poll == replace(poll, misses=0, missing_since_ns=0)
    # Lost: out of the index, listed as marked, record untouched.
    lost = replace(entry.poll, misses=3, missing_since_ns=T0, lost_ns=NOW_NS)
    assert store.set_poll("batches/a", 2, lost)  # type: ignore[attr-defined]
    assert due_names(harness, None) == []
    marked = list(store.iter_marked())  # type: ignore[attr-defined]
    assert [(m.record.name, m.poll.lost_ns, m.poll.overdue_ns) for m in marked] == [
        ("batches/a", NOW_NS, NOW_NS)
    ]
    # Seen again: rejoins at once, the mark cleared, the overdue mark kept.
    track(harness, "batches/a", State.RUNNING, T0 + 2 * S)
    (back,) = list(store.iter_due(NOW_NS))  # type: ignore[attr-defined]
    assert back.poll.lost_ns == 0 and back.poll.misses == 0 and back.poll.overdue_ns == NOW_NS
    # Terminal: leaves the index and the marked listing.
    track(harness, "batches/a", State.SUCCEEDED, T0 + 3 * S)
    assert due_names(harness, None) == []
    assert list(store.iter_marked()) == []  # type: ignore[attr-defined]


# --- records written by the previous release ------------------------------------------------

# The item exactly as the previous release's DynamoDBStore wrote an open batch (wire format).
LEGACY_ITEM = {
    "name": {"S": "batches/legacy"},
    "state": {"S": "RUNNING"},
    "rank": {"N": "1"},
    "update_ns": {"N": str(T0)},
    "version": {"N": "3"},
    "kind": {"S": "batch"},
    "source": {"S": "poll"},
    "details": {
        "M": {
            "not_found": {
                "M": {
                    "first_seen_at": {"S": "2026-06-01T09:00:00.000000000Z"},
                    "last_seen_at": {"S": "2026-06-01T09:05:00.000000000Z"},
                    "count": {"N": "2"},
                }
            }
        }
    },
    "created_ns": {"N": str(T0 - 600 * S)},
    "applied_ns": {"N": str(T0)},
    "update_time": {"S": "2026-06-01T10:00:00.000000000Z"},
    "created_at": {"S": "2026-06-01T09:50:00.000000000Z"},
    "applied_at": {"S": "2026-06-01T10:00:00.000000000Z"},
    "open_shard": {"N": "0"},  # shard_of("batches/legacy", 1)
    "open_update_ns": {"N": str(T0)},
}

# The previous release's SQLite schema and row.
LEGACY_SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    name        TEXT PRIMARY KEY,
    state       TEXT NOT NULL,
    rank        INTEGER NOT NULL,
    update_ns   TEXT NOT NULL,
    version     INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    source      TEXT NOT NULL,
    details     TEXT NOT NULL,
    created_ns  INTEGER NOT NULL,
    applied_ns  INTEGER NOT NULL,
    open_ns     TEXT,
    expires_at  INTEGER
);
CREATE INDEX IF NOT EXISTS operations_open ON operations (open_ns, name)
    WHERE open_ns IS NOT NULL;
"""


def poll_to_the_end(store: object, name: str) -> None:
    gateway = MemoryGateway()
    gateway.put(name, State.RUNNING, T0)
    clock = FakeClock(NOW_NS)
    first = reconcile_once(store, gateway, settings=SETTINGS, clock=clock)  # type: ignore[arg-type]
    assert first.polled == 1 and first.errors == 0
    gateway.put(name, State.SUCCEEDED, T0 + 5 * S)
    for _ in range(12):  # within its schedule (at most 30 minutes) of 5-minute runs
        clock.advance(300)
        reconcile_once(store, gateway, settings=SETTINGS, clock=clock)  # type: ignore[arg-type]
    assert gateway.requests[name] >= 2


def test_a_dynamodb_item_of_the_previous_release_is_polled_to_the_end() -> None:
    from moto import mock_aws

    from tests.support.stores import dynamodb_harness, shared_client

    with mock_aws():
        h = dynamodb_harness(shared_client(), kind="dynamodb-mock", shards=1)
        h.client.put_item(TableName=h.table, Item=LEGACY_ITEM)
        store = h.store
        assert isinstance(store, DynamoDBStore)
        (entry,) = list(store.iter_due(NOW_NS))
        assert entry.poll == PollState(due_ns=T0)  # "due since its update time"
        poll_to_the_end(store, "batches/legacy")
        record = store.get("batches/legacy")
        assert record is not None and record.state is State.SUCCEEDED
        raw = h.raw("batches/legacy")
        assert raw is not None and "open_update_ns" not in raw and "open_shard" not in raw


def test_a_sqlite_file_of_the_previous_release_is_upgraded_and_polled_to_the_end(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_SCHEMA)
    conn.execute(
        "INSERT INTO operations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            "batches/legacy",
            "RUNNING",
            1,
            f"{T0:021d}",
            3,
            "batch",
            "poll",
            '{"not_found": {"count": 2}}',
            T0 - 600 * S,
            T0,
            f"{T0:021d}",
            None,
        ),
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    try:
        (entry,) = list(store.iter_due(NOW_NS))
        assert entry.poll == PollState(due_ns=T0)
        poll_to_the_end(store, "batches/legacy")
        record = store.get("batches/legacy")
        assert record is not None and record.state is State.SUCCEEDED
        # The previous release's not-found flag holds only until the next observation.
        assert "not_found" not in record.details
    finally:
        store.close()


@pytest.fixture(params=("sqlite", "dynamodb-mock"))
def held(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_of(request, tmp_path, clock=lambda: NOW_NS) as h:
        yield h


def open_key(h: Harness, name: str) -> object:
    raw = h.raw(name)
    assert raw is not None
    return raw.get("open_update_ns", raw.get("open_ns"))


def test_a_young_unchanged_operation_is_polled_every_run_without_rewriting_its_index_key(
    held: Harness,
) -> None:
    """Issue 48: younger than 15 minutes, an operation is due again at the next run; a poll
    that changes nothing leaves its item (and so its open-index entry) as it was."""
    name = "batches/young"
    track(held, name, State.RUNNING, NOW_NS - S)
    key, version = open_key(held, name), held.raw(name)
    gateway = MemoryGateway()
    gateway.put(name, State.RUNNING, NOW_NS - S)
    clock = FakeClock(NOW_NS)
    for _ in range(3):  # 0, 5, 10 minutes old
        result = reconcile_once(held.store, gateway, settings=SETTINGS, clock=clock)  # type: ignore[arg-type]
        assert result.polled == 1 and result.errors == 0
        assert held.raw(name) == version and open_key(held, name) == key
        clock.advance(300)
    assert gateway.requests[name] == 3
    clock.advance(300)  # 20 minutes old: due again in 2.5 minutes, written as before
    reconcile_once(held.store, gateway, settings=SETTINGS, clock=clock)  # type: ignore[arg-type]
    poll = held.store.poll_state(name)  # type: ignore[attr-defined]
    assert poll is not None and poll.due_ns > clock.now_ns() - S
    assert gateway.requests[name] == 4


def test_with_its_period_known_a_poll_due_before_the_next_run_is_not_written(
    held: Harness,
) -> None:
    """Issue 48: with the run period known (OPSTATE_RECONCILE_RATE_MINUTES, 5), an unchanged
    operation up to 40 minutes old is due again within 5 minutes (1/8 of its age): polled
    every run, its item (and its open-index entry) never rewritten. Older, its interval
    outgrows the period and the write is made as before."""
    name = "batches/steady"
    track(held, name, State.RUNNING, NOW_NS - S)
    key, version = open_key(held, name), held.raw(name)
    gateway = MemoryGateway()
    gateway.put(name, State.RUNNING, NOW_NS - S)
    settings = replace(SETTINGS, reconcile_rate_s=300.0)
    clock = FakeClock(NOW_NS)
    for _ in range(9):  # 0 to 40 minutes old, one run every 5 minutes
        result = reconcile_once(held.store, gateway, settings=settings, clock=clock)  # type: ignore[arg-type]
        assert result.polled == 1 and result.errors == 0
        assert held.raw(name) == version and open_key(held, name) == key
        clock.advance(300)
    assert gateway.requests[name] == 9
    # 45 minutes old: due again in 5.6 minutes, after the next run: written.
    reconcile_once(held.store, gateway, settings=settings, clock=clock)  # type: ignore[arg-type]
    poll = held.store.poll_state(name)  # type: ignore[attr-defined]
    assert poll is not None and poll.due_ns == clock.now_ns() + int(45 * 60 / 8 * S)
    # Without the period (0: an operator's `opstate reconcile --once`), 20 minutes old is
    # written, as before issue 48's second step.
    other = "batches/unknown-period"
    track(held, other, State.RUNNING, clock.now_ns() - 20 * 60 * S)
    gateway.put(other, State.RUNNING, clock.now_ns() - 20 * 60 * S)
    reconcile_once(held.store, gateway, settings=SETTINGS, clock=clock)  # type: ignore[arg-type]
    poll = held.store.poll_state(other)  # type: ignore[attr-defined]
    assert poll is not None and poll.due_ns > clock.now_ns()


def test_a_run_that_leaves_operations_due_moves_every_polled_one_to_the_back(
    held: Harness,
) -> None:
    """Fairness: a run that could not poll everything due writes the held schedules too, so
    the next run starts with what waited longest."""
    names = ["batches/young-a", "batches/young-b"]
    gateway = MemoryGateway()
    for i, name in enumerate(names):
        track(held, name, State.RUNNING, NOW_NS - 10 * S + i)
        gateway.put(name, State.RUNNING, NOW_NS - 10 * S + i)
    settings = replace(SETTINGS, reconcile_open_limit=1)
    clock = FakeClock(NOW_NS)
    first = reconcile_once(held.store, gateway, settings=settings, clock=clock)  # type: ignore[arg-type]
    assert first.polled == 1 and first.stopped_early
    assert gateway.requests == {names[0]: 1}
    poll = held.store.poll_state(names[0])  # type: ignore[attr-defined]
    assert poll is not None and poll.due_ns == NOW_NS  # moved behind the other one
    clock.advance(300)
    reconcile_once(held.store, gateway, settings=settings, clock=clock)  # type: ignore[arg-type]
    assert gateway.requests == {names[0]: 1, names[1]: 1}


class ProgressGateway(MemoryGateway):
    """Answers carry a batch's progress (the ``batch_stats`` detail), as the Gemini API's do."""

    def __init__(self) -> None:
        super().__init__()
        self.progress: dict[str, dict[str, int]] = {}

    def fetch(self, record: OpRecord) -> OpEvent:
        event = super().fetch(record)
        stats = self.progress.get(record.name)
        return event if stats is None else replace(event, details={PROGRESS_DETAIL: dict(stats)})


def test_a_young_batch_poll_with_the_stored_progress_is_held_a_new_progress_written(
    held: Harness,
) -> None:
    name = "batches/counting"
    track(held, name, State.RUNNING, NOW_NS - S)
    gateway = ProgressGateway()
    gateway.put(name, State.RUNNING, NOW_NS - S)
    gateway.progress[name] = {"requestCount": 10, "successfulRequestCount": 1}
    clock = FakeClock(NOW_NS)

    def run() -> None:
        result = reconcile_once(held.store, gateway, settings=SETTINGS, clock=clock)  # type: ignore[arg-type]
        assert result.polled == 1 and result.errors == 0
        clock.advance(60)

    run()  # a progress the store does not hold yet: written
    assert held.store.get_progress(name) == gateway.progress[name]  # type: ignore[attr-defined]
    written = held.raw(name)
    run()  # the same progress: held, the item as it was
    assert held.raw(name) == written
    gateway.progress[name] = {"requestCount": 10, "successfulRequestCount": 4}
    run()  # moved on: written
    assert held.store.get_progress(name) == gateway.progress[name]  # type: ignore[attr-defined]
    assert gateway.requests[name] == 3


def test_a_reschedule_within_the_hour_keeps_the_open_index_key() -> None:
    """Issue 48: each reschedule moved ``open-index``'s sort key (the due time), a delete and a
    put on the index (ALL attributes projected) besides the table write. The key is now the
    due time's hour and ``poll_due_ns`` the due time: within the hour the index entry is
    updated in place (one write); the key moves when the due time leaves its hour, and the
    order (oldest due first) and the bound by ``now`` are the due time's, not the hour's."""
    from moto import mock_aws

    from opstate.store.dynamodb_items import OPEN_BUCKET_NS
    from tests.support.stores import dynamodb_harness, shared_client

    assert OPEN_BUCKET_NS == 3600 * S
    with mock_aws():
        h = dynamodb_harness(shared_client(), kind="dynamodb-mock", shards=1)
        store = h.store
        assert isinstance(store, DynamoDBStore)
        track(h, "batches/a", State.RUNNING, NOW_NS - 60 * S)
        raw = h.raw("batches/a")
        assert raw is not None
        assert raw["open_update_ns"] == T0 and raw["poll_due_ns"] == NOW_NS - 60 * S
        # Polled at 11:00, due again at 11:10, then at 11:40: the key stays 11:00.
        hour = NOW_NS  # 11:00, an hour's start
        assert store.set_poll("batches/a", 1, PollState(due_ns=hour + 600 * S))
        raw = h.raw("batches/a")
        assert raw is not None
        assert (raw["open_update_ns"], raw["poll_due_ns"]) == (hour, hour + 600 * S)
        assert store.set_poll("batches/a", 1, PollState(due_ns=hour + 2400 * S))
        raw = h.raw("batches/a")
        assert raw is not None
        assert (raw["open_update_ns"], raw["poll_due_ns"]) == (hour, hour + 2400 * S)
        # An item of the previous release (key: its due time itself, no poll_due_ns) and a
        # new one, both in the 11:00 hour: read at their due times, in order, bounded by now.
        old = {**LEGACY_ITEM, "name": {"S": "batches/old"}}
        old["open_update_ns"] = {"N": str(hour + 1200 * S)}
        h.client.put_item(TableName=h.table, Item=old)
        track(h, "batches/b", State.RUNNING, T0)
        assert store.set_poll("batches/b", 1, PollState(due_ns=hour + 300 * S))
        assert due_names(h, hour + 299 * S) == []
        assert due_names(h, hour + 1200 * S) == ["batches/b", "batches/old"]
        assert due_names(h, hour + 2400 * S) == ["batches/b", "batches/old", "batches/a"]
        assert [e.poll.due_ns for e in store.iter_due(None)] == [
            hour + 300 * S,
            hour + 1200 * S,
            hour + 2400 * S,
        ]
        # Leaving the hour moves the key; lost takes both out.
        assert store.set_poll("batches/a", 1, PollState(due_ns=hour + 4000 * S))
        raw = h.raw("batches/a")
        assert raw is not None and raw["open_update_ns"] == hour + 3600 * S
        assert store.set_poll("batches/a", 1, PollState(due_ns=hour, lost_ns=hour))
        raw = h.raw("batches/a")
        assert raw is not None and "open_update_ns" not in raw and "poll_due_ns" not in raw
        # The old item's next reschedule writes the new shape.
        assert store.set_poll("batches/old", 3, PollState(due_ns=hour + 1500 * S))
        raw = h.raw("batches/old")
        assert raw is not None
        assert (raw["open_update_ns"], raw["poll_due_ns"]) == (hour, hour + 1500 * S)
