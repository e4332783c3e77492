"""The archive state beside each terminal record, on every store: its own conditional write
(never the record's version, state, details or keys), the due listing, and records of the
previous release (no archive state) listed and archived after the upgrade."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from opstate.ingest import ingest
from opstate.model import OpEvent
from opstate.states import State
from opstate.store.port import ArchiveState, ArchivingStore
from opstate.store.sqlite import SQLiteStore
from opstate.times import parse_time
from tests.integration.test_store_polls import LEGACY_ITEM, LEGACY_SCHEMA
from tests.support.stores import STORE_KINDS, Harness, harness_for

S = 1_000_000_000
T0 = parse_time("2026-06-01T10:00:00Z")
NOW_NS = T0 + 3600 * S


@pytest.fixture(params=STORE_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    def endpoint() -> str:
        server = request.getfixturevalue("moto_server")
        return str(server.endpoint)

    with harness_for(
        request.param, tmp_path=tmp_path, moto_endpoint=endpoint, clock=lambda: NOW_NS
    ) as h:
        yield h


def track(h: Harness, name: str, state: State, t: int, **details: object) -> None:
    ingest(h.store, OpEvent(name, state, t, "report", dict(details)), clock_ns=lambda: NOW_NS)


def archiving(h: Harness) -> ArchivingStore:
    assert isinstance(h.store, ArchivingStore)
    return h.store


def due(store: ArchivingStore, now_ns: int = NOW_NS) -> list[str]:
    return [e.record.name for e in store.iter_archive_due(now_ns)]


def test_archive_state_is_its_own_conditional_write(harness: Harness) -> None:
    store = archiving(harness)
    track(harness, "batches/open", State.RUNNING, T0)
    track(harness, "batches/done", State.SUCCEEDED, T0, output_file_uri="files/1")
    record = store.get("batches/done")
    assert record is not None and store.get_archive("batches/done") is None
    before_raw = harness.raw("batches/done")
    pending = ArchiveState("pending", created_ns=record.created_ns, due_ns=NOW_NS + 60 * S)
    # Only a terminal record has an archive; the wrong incarnation or revision writes nothing.
    assert not store.set_archive("batches/open", 0, pending)
    assert not store.set_archive("batches/done", 0, ArchiveState("pending", created_ns=1))
    assert not store.set_archive("batches/done", 3, pending)
    assert not store.set_archive("batches/none", 0, pending)
    assert store.set_archive("batches/done", 0, pending)
    assert not store.set_archive("batches/done", 0, pending)  # a second claimer loses
    stored = store.get_archive("batches/done")
    assert stored is not None and stored.rev == 1 and stored.status == "pending"
    summary = {"objects": [{"location": "file:///x", "bytes": 3, "sha256": "ab"}], "requests": 2}
    done = ArchiveState(
        "archived", created_ns=record.created_ns, archived_ns=NOW_NS, summary=summary
    )
    assert store.set_archive("batches/done", 1, done)
    stored = store.get_archive("batches/done")
    assert stored is not None and stored.rev == 2 and stored.summary == summary
    # The record itself is untouched: same version, state, details, keys.
    assert store.get("batches/done") == record
    after_raw = harness.raw("batches/done")
    if harness.kind.startswith("dynamodb") and before_raw and after_raw:
        assert {k: v for k, v in after_raw.items() if not k.startswith("archive")} == before_raw
    # A refreshed terminal record (ingest's replace) keeps its archive state.
    track(harness, "batches/done", State.SUCCEEDED, T0 + S, output_file_uri="files/1")
    refreshed = store.get("batches/done")
    assert refreshed is not None and refreshed.version == record.version + 1
    assert store.get_archive("batches/done") == stored


def test_due_listing_holds_unsettled_terminal_records_soonest_first(harness: Harness) -> None:
    store = archiving(harness)
    for name in ("batches/c", "batches/a", "batches/b", "batches/d"):
        track(harness, name, State.SUCCEEDED, T0)
    track(harness, "batches/open", State.RUNNING, T0)
    created = {n: store.get(n).created_ns for n in ("batches/a", "batches/b", "batches/d")}  # type: ignore[union-attr]
    assert store.set_archive(
        "batches/a", 0, ArchiveState("failed", created_ns=created["batches/a"], due_ns=NOW_NS)
    )
    assert store.set_archive(
        "batches/b", 0, ArchiveState("pending", created_ns=created["batches/b"], due_ns=NOW_NS + S)
    )
    assert store.set_archive(
        "batches/d", 0, ArchiveState("archived", created_ns=created["batches/d"])
    )
    # No state yet first (due at once), then by due time; settled and open records never.
    assert due(store) == ["batches/c", "batches/a"]
    assert due(store, NOW_NS + S) == ["batches/c", "batches/a", "batches/b"]


def test_a_dynamodb_item_of_the_previous_release_is_listed_and_archived() -> None:
    from moto import mock_aws

    from tests.support.stores import dynamodb_harness, shared_client

    legacy = {k: v for k, v in LEGACY_ITEM.items() if k not in ("open_shard", "open_update_ns")}
    legacy.update(
        name={"S": "batches/old"},
        state={"S": "SUCCEEDED"},
        rank={"N": "3"},
        expires_at={"N": str(T0 // S + 90 * 86400)},
    )
    with mock_aws():
        h = dynamodb_harness(shared_client(), kind="dynamodb-mock", shards=1)
        h.client.put_item(TableName=h.table, Item=legacy)
        store = archiving(h)
        assert store.get_archive("batches/old") is None
        (entry,) = list(store.iter_archive_due(NOW_NS))
        assert entry.record.name == "batches/old" and entry.archive is None
        created = entry.record.created_ns
        assert store.set_archive("batches/old", 0, ArchiveState("expired", created_ns=created))
        assert due(store) == []
        record = store.get("batches/old")
        assert record is not None and record.version == 3


def test_a_sqlite_file_of_the_previous_release_gets_the_archive_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_SCHEMA)
    conn.execute(
        "INSERT INTO operations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            "batches/old",
            "SUCCEEDED",
            3,
            f"{T0:021d}",
            3,
            "batch",
            "poll",
            "{}",
            0,
            T0,
            None,
            T0 // S + 90 * 86400,
        ),
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    try:
        (entry,) = list(store.iter_archive_due(NOW_NS))
        assert entry.archive is None and entry.record.created_ns == 0
        assert store.set_archive("batches/old", 0, ArchiveState("pending", due_ns=NOW_NS + S))
        assert due(store) == []
        assert due(store, NOW_NS + S) == ["batches/old"]
    finally:
        store.close()


def test_progress_is_kept_beside_an_open_record(harness: Harness) -> None:
    from opstate.store import PollState

    store = archiving(harness)
    track(harness, "batches/p", State.RUNNING, T0)
    assert store.get_progress("batches/p") is None
    stats = {"requestCount": 10, "pendingRequestCount": 7}
    assert store.set_poll("batches/p", 1, PollState(due_ns=NOW_NS, progress=stats))  # type: ignore[attr-defined]
    assert store.get_progress("batches/p") == stats
    # A poll state without progress keeps the stored one; the record never moved.
    assert store.set_poll("batches/p", 1, PollState(due_ns=NOW_NS + S))  # type: ignore[attr-defined]
    assert store.get_progress("batches/p") == stats
    record = store.get("batches/p")
    assert record is not None and record.version == 1
