"""The archive state beside each terminal record, on every store: its own conditional write
(never the record's version, state, details or keys), the due listing, and records of the
previous release (no archive state) listed and archived after the upgrade."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.ingest import ingest
from opstate.store.port import ArchiveState, ArchivingStore
from opstate.store.sqlite import SQLiteStore
from tests.integration.test_store_polls import LEGACY_ITEM, LEGACY_SCHEMA
from tests.support.stores import STORE_KINDS, Harness, harness_of

S = 1_000_000_000
T0 = parse_time("2026-06-01T10:00:00Z")
NOW_NS = T0 + 3600 * S


@pytest.fixture(params=STORE_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_of(request, tmp_path, clock=lambda: NOW_NS) as h:
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

        def record_attrs(raw: dict[str, object]) -> dict[str, object]:
            return {k: v for k, v in raw.items() if not k.startswith("archive")}

        assert record_attrs(after_raw) == record_attrs(before_raw)
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


# --- DynamoDB: the archive queue (archive-index) --------------------------------------------


class ScanCounter:
    """Counts the DynamoDB Scan calls a client makes (botocore's before-call event)."""

    def __init__(self, client: object) -> None:
        self.scans = 0
        client.meta.events.register("before-call.dynamodb.Scan", self._count)  # type: ignore[attr-defined]

    def _count(self, **_: object) -> None:
        self.scans += 1


def test_dynamodb_finds_due_archives_on_its_index_without_scanning_the_table() -> None:
    """A terminal record is queued on archive-index as it becomes terminal; the due listing is
    a Query; a settled archive leaves the index and a refreshed terminal record does not
    rejoin it; an open claim is due again at its lease's end."""
    from moto import mock_aws

    from tests.support.stores import dynamodb_harness, shared_client

    with mock_aws():
        h = dynamodb_harness(shared_client(), kind="dynamodb-mock", shards=2)
        store = archiving(h)
        scans = ScanCounter(h.client)
        track(h, "batches/open", State.RUNNING, T0)
        track(h, "batches/becomes-done", State.RUNNING, T0)
        track(h, "batches/becomes-done", State.SUCCEEDED, T0 + S)  # a replace
        track(h, "batches/born-done", State.FAILED, T0)  # a create
        assert due(store) == ["batches/becomes-done", "batches/born-done"]
        assert due(store) == ["batches/becomes-done", "batches/born-done"]
        assert scans.scans == 1  # the previous releases' items, once per process and table
        raw = h.raw("batches/becomes-done")
        assert raw is not None
        assert raw["archive_queue"].startswith("due#") and raw["archive_due_ns"] == 0
        # A claim is due again at its lease's end.
        record = store.get("batches/becomes-done")
        assert record is not None
        lease = ArchiveState("pending", created_ns=record.created_ns, due_ns=NOW_NS + 60 * S)
        assert store.set_archive("batches/becomes-done", 0, lease)
        assert due(store) == ["batches/born-done"]
        assert due(store, NOW_NS + 60 * S) == ["batches/born-done", "batches/becomes-done"]
        # Settled: out of the index, and a refresh of the terminal record does not re-queue it.
        done = ArchiveState("archived", created_ns=record.created_ns, archived_ns=NOW_NS)
        assert store.set_archive("batches/becomes-done", 1, done)
        raw = h.raw("batches/becomes-done")
        assert raw is not None
        assert raw["archive_queue"] == "done" and "archive_due_ns" not in raw
        settled = store.get_archive("batches/becomes-done")
        track(h, "batches/becomes-done", State.SUCCEEDED, T0 + 2 * S)
        assert store.get("batches/becomes-done").version == 3  # type: ignore[union-attr]
        assert store.get_archive("batches/becomes-done") == settled
        assert h.raw("batches/becomes-done")["archive_queue"] == "done"  # type: ignore[index]
        assert due(store, NOW_NS + 3600 * S) == ["batches/born-done"]
        assert scans.scans == 1


def test_dynamodb_items_of_the_previous_release_are_queued_once() -> None:
    """Items written before archive-index (no archive_queue): unsettled ones, due or not, are
    found by one filtered Scan per process and queued; settled ones are left alone."""
    from moto import mock_aws

    from opstate.store import dynamodb
    from tests.support.stores import dynamodb_harness, shared_client

    def legacy_item(name: str, **archive: object) -> dict[str, object]:
        item = {k: v for k, v in LEGACY_ITEM.items() if k not in ("open_shard", "open_update_ns")}
        item.update(
            name={"S": name},
            state={"S": "SUCCEEDED"},
            rank={"N": "3"},
            expires_at={"N": str(T0 // S + 90 * 86400)},
        )
        if archive:
            state = ArchiveState(**archive)  # type: ignore[arg-type]
            item.update(
                archive=dynamodb.to_attr(state.as_dict()),
                archive_status={"S": state.status},
                archive_rev={"N": "1"},
                archive_due_ns={"N": str(state.due_ns)},
            )
        return item

    with mock_aws():
        h = dynamodb_harness(shared_client(), kind="dynamodb-mock", shards=1)
        for item in (
            legacy_item("batches/never-looked-at"),
            legacy_item("batches/failed-due", status="failed", due_ns=NOW_NS - S),
            legacy_item("batches/pending-later", status="pending", due_ns=NOW_NS + 60 * S),
            legacy_item("batches/archived", status="archived"),
        ):
            h.client.put_item(TableName=h.table, Item=item)
        store = archiving(h)
        scans = ScanCounter(h.client)
        assert due(store) == ["batches/never-looked-at", "batches/failed-due"]
        assert scans.scans == 1
        for name in ("batches/never-looked-at", "batches/failed-due", "batches/pending-later"):
            assert h.raw(name)["archive_queue"].startswith("due#")  # type: ignore[index]
        assert "archive_queue" not in h.raw("batches/archived")  # type: ignore[operator]
        # A second store in the same process (the next invocation): the index only.
        again = dynamodb.DynamoDBStore(h.table, client=h.client, shards=1, clock=lambda: NOW_NS)
        assert [e.record.name for e in again.iter_archive_due(NOW_NS + 60 * S)] == [
            "batches/never-looked-at",
            "batches/failed-due",
            "batches/pending-later",
        ]
        assert scans.scans == 1
        # The record of an item queued this way is what it was.
        record = store.get("batches/never-looked-at")
        assert record is not None and record.version == 3


def test_dynamodb_scans_while_the_index_is_still_being_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Just after the upgrade DynamoDB refuses Queries on the index it is building (a
    ValidationException): the listing is the filtered Scan, as before, not a failure."""
    from botocore.exceptions import ClientError
    from moto import mock_aws

    from tests.support.stores import dynamodb_harness, shared_client

    with mock_aws():
        h = dynamodb_harness(shared_client(), kind="dynamodb-mock", shards=1)
        store = archiving(h)
        track(h, "batches/done", State.SUCCEEDED, T0)
        track(h, "batches/open", State.RUNNING, T0)

        def building(**_: object) -> None:
            error = {
                "Code": "ValidationException",
                "Message": "Cannot read from backfilling global secondary index: archive-index",
            }
            raise ClientError({"Error": error}, "Query")

        monkeypatch.setattr(h.client, "query", building)  # the client is shared: undone after
        assert due(store) == ["batches/done"]

        def broken(**_: object) -> None:
            raise ClientError({"Error": {"Code": "ValidationException", "Message": "x"}}, "Query")

        monkeypatch.setattr(h.client, "query", broken)
        with pytest.raises(ClientError):  # any other refusal is a bug, not a reason to scan
            due(store)
