"""The table of the SQLite store (``opstate.store.sqlite``) and its rows: the schema, the columns
added on open to a file an earlier release wrote, the row codecs, what an ``sqlite3`` error
means, and ``SQLiteParts``, the base the store's parts (``sqlite_polls``, ``sqlite_archives``,
``sqlite_retries``) share with ``SQLiteStore``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any, NoReturn

from opstate.domain.model import OpRecord
from opstate.domain.states import parse_state
from opstate.store.port import ArchiveState, Due, PollState
from opstate.store.retry_state import RetryState

NS_DIGITS = 21  # enough for any instant up to year 9999 in ns
PAGE = 500

SCHEMA = """
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
CREATE TABLE IF NOT EXISTS counters (
    name        TEXT PRIMARY KEY,
    value       INTEGER NOT NULL
);
"""

# Poll-state columns added after the first release (a file written by it lacks them).
POLL_COLUMNS = ("poll_misses", "poll_missing_since_ns", "lost_ns", "overdue_ns")
# The archive state beside a terminal record (opstate.outcomes), added after the poll state:
# ``archive`` is its JSON (NULL: none yet), the other three are copies the queries filter on.
ARCHIVE_COLUMNS = (
    ("archive", "TEXT"),
    ("archive_status", "TEXT"),
    ("archive_rev", "INTEGER NOT NULL DEFAULT 0"),
    ("archive_due_ns", "INTEGER NOT NULL DEFAULT 0"),
    ("progress", "TEXT"),  # PollState.progress (JSON), a running batch's batchStats
)
# The retry state beside any record (issue 33, ``store.retry_state``), added after the archive:
# ``retry`` is its JSON (NULL: none), the other three are copies the queries filter on.
RETRY_COLUMNS = (
    ("retry", "TEXT"),
    ("retry_status", "TEXT"),
    ("retry_rev", "INTEGER NOT NULL DEFAULT 0"),
    ("retry_due_ns", "INTEGER NOT NULL DEFAULT 0"),
)
# The active retry roots by due time; created once its columns exist (``add_poll_columns``).
RETRY_INDEX = (
    "CREATE INDEX IF NOT EXISTS operations_retry ON operations (retry_due_ns, name) "
    "WHERE retry_status = 'active'"
)
# SQLite integers stop at 2**63 - 1: the indexed copy of a later due time is cut there (the
# JSON keeps the exact value; only instants after the year 2262 sort together).
MAX_SQLITE_INT = 2**63 - 1

COLUMNS = (
    "name, state, rank, update_ns, version, kind, source, details, created_ns, applied_ns, "
    "open_ns, expires_at"
)
SELECT = f"SELECT {COLUMNS} FROM operations"
SELECT_ARCHIVE = f"SELECT {COLUMNS}"
SELECT_DUE = f"SELECT {COLUMNS}, {', '.join(POLL_COLUMNS)}, progress FROM operations"

# Fragments of sqlite3.OperationalError messages that mean "not now", not "wrong SQL".
_UNAVAILABLE_MESSAGES = (
    "locked",
    "busy",
    "disk",
    "i/o error",
    "unable to open",
    "readonly",
    "read-only",
    "out of memory",
)


def ns_text(ns: int) -> str:
    return f"{ns:0{NS_DIGITS}d}"


def is_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` is SQLite's "database or disk is full" (SQLITE_FULL)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    return code == sqlite3.SQLITE_FULL or "is full" in str(exc).lower()


def is_unavailable(exc: sqlite3.Error) -> bool:
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return any(fragment in text for fragment in _UNAVAILABLE_MESSAGES)
    return False


def add_poll_columns(conn: sqlite3.Connection) -> None:
    """Add the poll-state, archive and retry columns a file of an earlier release lacks, then
    the retry index (on those columns)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(operations)")}
    wanted = [(c, "INTEGER NOT NULL DEFAULT 0") for c in POLL_COLUMNS]
    for column, kind in [*wanted, *ARCHIVE_COLUMNS, *RETRY_COLUMNS]:
        if column not in have:
            try:
                conn.execute(f"ALTER TABLE operations ADD COLUMN {column} {kind}")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc).lower():  # another process won
                    raise
    conn.execute(RETRY_INDEX)


class SQLiteParts:
    """What the store's parts use of ``SQLiteStore``: this thread's connection, and the error
    an ``sqlite3.Error`` becomes (``StoreUnavailableError`` when it means "not now")."""

    def _conn(self) -> sqlite3.Connection:
        raise NotImplementedError

    def _raise(self, exc: sqlite3.Error) -> NoReturn:
        raise NotImplementedError

    def _cell(self, name: str, column: str) -> str | None:
        """The text in ``column`` (one of this schema's own JSON columns, never a caller's
        string) of ``name``'s row; None when there is no row or the cell is NULL."""
        try:
            row = (
                self._conn()
                .execute(f"SELECT {column} FROM operations WHERE name = ?", (name,))
                .fetchone()
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        return row[0] if row else None


def due_of(row: Sequence[Any]) -> Due:
    record = record_of(row)
    open_ns = row[10]
    misses, missing_since, lost, overdue = (int(v or 0) for v in row[12:16])
    progress = json.loads(row[16]) if len(row) > 16 and row[16] else None
    return Due(
        record,
        PollState(
            due_ns=int(open_ns) if open_ns is not None else 0,
            misses=misses,
            missing_since_ns=missing_since,
            lost_ns=lost,
            overdue_ns=overdue,
            progress=progress if isinstance(progress, dict) else None,
        ),
    )


def archive_of(text: str | None) -> ArchiveState | None:
    if not text:
        return None
    raw = json.loads(text)
    return ArchiveState.from_dict(raw) if isinstance(raw, dict) else None


def retry_of(text: str | None) -> RetryState | None:
    if not text:
        return None
    raw = json.loads(text)
    return RetryState.from_dict(raw) if isinstance(raw, dict) else None


def record_of(row: Sequence[Any]) -> OpRecord:
    details = json.loads(row[7])
    return OpRecord(
        name=row[0],
        state=parse_state(row[1]),
        update_time_ns=int(row[3]),
        version=int(row[4]),
        source=row[6],
        details=details if isinstance(details, dict) else {},
        created_ns=int(row[8]),
        applied_ns=int(row[9]),
    )
