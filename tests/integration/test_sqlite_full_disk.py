"""The SQLite store on a full disk, and what a commit promises (issue 24 item 3).

Before: the store ran ``synchronous=NORMAL`` and SQLite's default WAL checkpointing (every 1000
pages). On a small disk the WAL took all the space while the database stayed empty, and the
space freed later went to WAL frames again: a few writes later the store answered 503 again.

The full-disk test mounts a 2 MiB tmpfs, so it needs root: it is skipped locally (one line)
without it and fails under CI=true (tests/support/prerequisites.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from opstate.domain.events import from_report
from opstate.ingest import ingest
from opstate.store.port import StoreUnavailableError
from opstate.store.sqlite import JOURNAL_SIZE_LIMIT_BYTES, SQLiteStore
from tests.support.prerequisites import require

DETAILS = {"blob": "x" * 2000}
FREED_BYTES = 200 * 1024


def _can_mount() -> bool:
    return os.name == "posix" and os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    require(
        _can_mount(),
        "the full-disk test mounts a tmpfs and needs root (and mount)",
        fail_prefix="",
        skip_prefix="",
    )
    disk = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def _write(store: SQLiteStore, name: str) -> None:
    event = from_report(name, {"state": "RUNNING", "details": DETAILS}, now_ns=time.time_ns())
    assert ingest(store, event).applied


def _wal_bytes(db: Path) -> int:
    wal = db.with_name(db.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def _fill(store: SQLiteStore, db: Path, prefix: str, acknowledged: list[str]) -> int:
    """Write until the disk is full; the largest WAL seen on the way."""
    largest = 0
    for n in range(10_000):
        name = f"batches/{prefix}-{n}"
        try:
            _write(store, name)
        except StoreUnavailableError as exc:
            assert "full" in str(exc)
            return largest
        acknowledged.append(name)
        largest = max(largest, _wal_bytes(db))
    raise AssertionError("the 2 MiB disk never filled up")


def test_a_full_disk_is_survived_and_freed_space_is_used(small_disk: Path) -> None:
    db = small_disk / "ops.db"
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * FREED_BYTES)
    store = SQLiteStore(db)
    acknowledged: list[str] = []
    largest_wal = _fill(store, db, "before", acknowledged)
    # The WAL stays bounded: the data sits in the database, not in frames waiting to move.
    assert largest_wal <= JOURNAL_SIZE_LIMIT_BYTES, largest_wal
    assert db.stat().st_size > _wal_bytes(db)
    before = len(acknowledged)

    filler.unlink()  # the operator frees 200 KiB
    _fill(store, db, "after", acknowledged)
    after = len(acknowledged) - before
    # 200 KiB hold about fifty of these rows; the old store managed ten before 503 again.
    assert after >= 25, after

    # Nothing acknowledged was lost: every row is read back, before and after a reopen.
    for name in acknowledged:
        assert store.get(name) is not None, name
    store.close()
    reopened = SQLiteStore(db)
    try:
        assert sum(1 for _ in reopened.iter_all()) == len(acknowledged)
    finally:
        reopened.close()


def test_a_clean_stop_checkpoints_the_wal(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    store = SQLiteStore(db)
    for n in range(50):
        _write(store, f"batches/clean-{n}")
    assert _wal_bytes(db) > 0
    # Another process holding the file open keeps SQLite from checkpointing on its own close.
    other = SQLiteStore(db)
    assert other.get("batches/clean-0") is not None
    store.close()
    assert _wal_bytes(db) == 0
    other.close()


def test_every_commit_is_synced_to_disk(tmp_path: Path) -> None:
    """synchronous=FULL: a 200 means the record survives power loss, not only a crash (the
    cost is measured by benchmarks/bench_sqlite_sync.py; docs/local.md)."""
    store = SQLiteStore(tmp_path / "ops.db")
    try:
        conn = store._conn()
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 100
        limit = conn.execute("PRAGMA journal_size_limit").fetchone()[0]
        assert limit == JOURNAL_SIZE_LIMIT_BYTES
    finally:
        store.close()
