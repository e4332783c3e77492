"""Issue 30, as it was reported: ``opstate serve`` and ``opstate`` commands on one SQLite file.

The cause: SQLite's locks are POSIX advisory locks, which a process loses on every descriptor of
a file when it closes any descriptor of it. The store's and the quarantine's constructors opened
and closed the database file (to create it 0600) while the process already held a connection:
serve lost its locks, the next ``opstate`` command to close its connection believed it was the
last one, checkpointed and deleted the ``-wal`` and ``-shm`` under serve, and what either side
wrote afterwards was lost. These tests fail on that code and pass on the fix
(``opstate.private_files.create_database_file`` never opens the database file).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.quarantine import SQLiteQuarantine
from opstate.store.sqlite import SQLiteStore
from opstate.waiters.sqlite import SQLiteWaiterStore
from tests.reliability.file_checks import deleted_handles, final_rows, integrity
from tests.support.serve_process import cli_env, http, run_cli, start_serve

SERVED = 40
TRACKED = 10


@pytest.mark.timeout(120)
def test_serve_and_ten_opstate_track_keep_all_fifty_records(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    store = f"sqlite:///{db}"
    server = start_serve(["--store", store], cwd=tmp_path, env={"OPSTATE_WEBHOOK_SECRETS": None})
    acked: list[str] = []
    failures: list[str] = []
    vanished: list[str] = []
    try:
        for i in range(SERVED):
            name = f"batches/served-{i:02d}"
            status, _, body = http(
                "PUT",
                f"{server.url}/operations/{name}",
                json.dumps({"state": "PENDING"}).encode(),
                {"content-type": "application/json"},
            )
            if status == 200:
                acked.append(name)
            else:
                failures.append(f"PUT {name}: {status} {body}")
            if i % 4 == 3:  # ten times, between serve's answers
                name = f"batches/cli-{i // 4}"
                result = run_cli(["track", name, "--store", store], cwd=tmp_path)
                if result.returncode == 0 and "created" in result.stdout:
                    acked.append(name)
                else:
                    failures.append(f"opstate track {name}: {result.stderr.strip()}")
                sides = (tmp_path / "ops.db-wal", tmp_path / "ops.db-shm")
                vanished += [f"{p.name} after {name}" for p in sides if not p.exists()]
        held_deleted = deleted_handles(server.process.pid, db)
        assert server.terminate() == 0
    finally:
        server.kill()
    rows = final_rows(db)
    lost = [name for name in acked if name not in rows]
    said = (
        f"{len(acked)} of {SERVED + TRACKED} writes acknowledged, {len(lost)} of them lost "
        f"({lost[:5]}); {len(failures)} failures ({failures[:2]}); vanished {vanished[:3]}; "
        f"serve held deleted {held_deleted}"
    )
    assert integrity(db) == "ok", said
    assert (len(acked), lost, failures, vanished, held_deleted) == (
        SERVED + TRACKED,
        [],
        [],
        [],
        [],
    ), said


_OTHER_PROCESS = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], timeout=10)
    if sys.argv[2] == "write":
        conn.execute("CREATE TABLE IF NOT EXISTS side (n INTEGER)")
        conn.execute("INSERT INTO side VALUES (1)")
        conn.commit()
    print(conn.execute("SELECT COUNT(*) FROM operations").fetchone()[0])
    conn.close()
    """
)


def other_process(db: Path, what: str) -> int:
    """A plain sqlite3 connection in another process: open, (write,) count, close."""
    result = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, str(db), what],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(result.stdout)


def record(i: int) -> OpRecord:
    return OpRecord(
        name=f"batches/own-{i:02d}",
        state=State.PENDING,
        update_time_ns=1_780_000_000_000_000_000 + i,
        version=1,
        source="report",
    )


@pytest.mark.timeout(60)
def test_constructors_on_a_held_file_keep_this_process_locks(tmp_path: Path) -> None:
    """The store holds a connection; the quarantine and the waiters are built on its file (as
    serve does); another process then opens, writes and closes the file. It must not find
    itself the last user: the WAL stays, and what this process writes next is seen by others
    and survives."""
    db = tmp_path / "ops.db"
    store = SQLiteStore(db)
    try:
        assert store.put_if_absent(record(0)).ok
        SQLiteQuarantine(db)
        SQLiteWaiterStore(db)
        assert other_process(db, "write") == 1
        assert (tmp_path / "ops.db-wal").exists() and (tmp_path / "ops.db-shm").exists()
        assert deleted_handles(os.getpid(), db) == []
        for i in range(1, 21):
            assert store.put_if_absent(record(i)).ok
        assert other_process(db, "read") == 21
    finally:
        store.close()
    assert integrity(db) == "ok"
    assert sorted(final_rows(db)) == [record(i).name for i in range(21)]
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT COUNT(*) FROM side").fetchone() == (1,)
    finally:
        conn.close()
