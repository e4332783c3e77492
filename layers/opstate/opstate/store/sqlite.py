"""The embedded store: one SQLite file, the same conditional-write semantics as DynamoDB.

- WAL journal, ``busy_timeout``, ``synchronous=FULL`` (a commit is on disk before it returns:
  a 200 survives power loss, not only a crash of the process); one connection per thread
  (``threading.local``), all tracked so ``close()`` closes them. Several processes may share one
  file: every write is one statement, its own transaction (autocommit), which takes the
  database's write lock (waiting up to ``busy_timeout``) before it reads the row it tests.
- A bounded WAL, so that a full disk is survived: committed pages move into the database
  every ``WAL_AUTOCHECKPOINT_PAGES`` (not SQLite's 1000), the WAL file is cut back to
  ``JOURNAL_SIZE_LIMIT_BYTES`` after a checkpoint, a write that fails for lack of space runs a
  checkpoint and is tried once more, and ``close()`` checkpoints (a clean stop leaves no WAL
  to replay). Without this a full disk was all WAL, and space freed later went to WAL frames
  again: the store kept answering 503.
- put-if-absent: ``INSERT ... ON CONFLICT(name) DO NOTHING``; replace:
  ``UPDATE ... WHERE name = ? AND version = ?``: the condition and the write are one atomic
  statement. When it changes no row, the current row is selected and returned (the record that
  beat us, or a later one: either is newer than what the caller read). A new record costs two
  statements (the read, the insert), not four (``BEGIN IMMEDIATE`` and ``COMMIT`` around it).
- Open listing: ``open_ns`` is set only while the operation is open and not lost (NULL when
  terminal or lost) and a partial index on ``(open_ns, name) WHERE open_ns IS NOT NULL`` serves
  ``list_open`` and ``iter_due``. ``open_ns`` is when the operation is next due for a poll
  (``PollState.due_ns``); the previous release wrote the update time there, which reads as
  "due since then". ``poll_misses``, ``poll_missing_since_ns``, ``lost_ns`` and ``overdue_ns``
  hold the rest of the poll state; a file of the previous release gets them on open
  (``ALTER TABLE ... ADD COLUMN``, default 0).
- The archive state of a terminal record (``ArchiveState``, ``opstate.outcomes``): ``archive``
  (its JSON, NULL: none yet) and the copies the queries filter on, ``archive_status``,
  ``archive_rev`` and ``archive_due_ns``; added on open like the poll columns. ``set_archive``
  is its own ``UPDATE ... WHERE archive_rev = ?``: it never touches the record's columns.
- Times in ns are stored as zero-padded decimal text: SQLite integers stop at 2**63 (year 2262)
  and the model accepts instants up to year 9999; fixed-width digits sort as numbers.
- ``details`` is JSON text. ``expires_at`` (epoch seconds) is kept for terminal records, as on
  DynamoDB; ``purge_expired`` deletes what is past it (SQLite has no TTL of its own).

"database is locked", busy, disk and I/O errors raise ``StoreUnavailableError``; SQL errors are
bugs and propagate.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from opstate.config import DEFAULT_RETENTION_DAYS
from opstate.domain.model import OpRecord
from opstate.domain.states import parse_state
from opstate.private_files import create_database_file
from opstate.store.port import (
    WRITTEN,
    ArchiveEntry,
    ArchiveState,
    Due,
    PollState,
    StoreUnavailableError,
    WriteOutcome,
    expires_at,
    initial_due,
    validate_record,
)

DEFAULT_BUSY_TIMEOUT_S = 5.0
WAL_AUTOCHECKPOINT_PAGES = 100
JOURNAL_SIZE_LIMIT_BYTES = 1024 * 1024
SYNCHRONOUS = "FULL"
_NS_DIGITS = 21  # enough for any instant up to year 9999 in ns
_PAGE = 500

_SCHEMA = """
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

# Poll-state columns added after the first release (a file written by it lacks them).
_POLL_COLUMNS = ("poll_misses", "poll_missing_since_ns", "lost_ns", "overdue_ns")
# The archive state beside a terminal record (opstate.outcomes), added after the poll state:
# ``archive`` is its JSON (NULL: none yet), the other three are copies the queries filter on.
_ARCHIVE_COLUMNS = (
    ("archive", "TEXT"),
    ("archive_status", "TEXT"),
    ("archive_rev", "INTEGER NOT NULL DEFAULT 0"),
    ("archive_due_ns", "INTEGER NOT NULL DEFAULT 0"),
    ("progress", "TEXT"),  # PollState.progress (JSON), a running batch's batchStats
)

_COLUMNS = (
    "name, state, rank, update_ns, version, kind, source, details, created_ns, applied_ns, "
    "open_ns, expires_at"
)
_SELECT = f"SELECT {_COLUMNS} FROM operations"
_SELECT_ARCHIVE = f"SELECT {_COLUMNS}"
_SELECT_DUE = f"SELECT {_COLUMNS}, {', '.join(_POLL_COLUMNS)} FROM operations"

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


def _ns_text(ns: int) -> str:
    return f"{ns:0{_NS_DIGITS}d}"


def _is_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` is SQLite's "database or disk is full" (SQLITE_FULL)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    return code == sqlite3.SQLITE_FULL or "is full" in str(exc).lower()


def _is_unavailable(exc: sqlite3.Error) -> bool:
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return any(fragment in text for fragment in _UNAVAILABLE_MESSAGES)
    return False


class SQLiteStore:
    """The store port on one SQLite file (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.path = Path(path)
        if str(path) == ":memory:":
            raise ValueError("SQLiteStore needs a file (one connection per thread); use memory://")
        self.busy_timeout_s = busy_timeout_s
        self.retention_days = retention_days
        self._clock = clock
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._generation = 0
        create_database_file(self.path)  # 0600 from the first byte, never opened here
        conn = self._conn()
        try:
            self._with_lock_retry(lambda: conn.executescript(_SCHEMA))
            self._with_lock_retry(lambda: self._add_poll_columns(conn))
        except sqlite3.Error as exc:
            self._raise(exc)

    @staticmethod
    def _add_poll_columns(conn: sqlite3.Connection) -> None:
        have = {row[1] for row in conn.execute("PRAGMA table_info(operations)")}
        wanted = [(c, "INTEGER NOT NULL DEFAULT 0") for c in _POLL_COLUMNS]
        for column, kind in [*wanted, *_ARCHIVE_COLUMNS]:
            if column not in have:
                try:
                    conn.execute(f"ALTER TABLE operations ADD COLUMN {column} {kind}")
                except sqlite3.OperationalError as exc:
                    if "duplicate column" not in str(exc).lower():  # another process won
                        raise

    # -- connections -------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "generation", -1) == self._generation:
            return conn
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,  # autocommit; transactions are explicit
                check_same_thread=False,  # used by one thread; closed by close() from any
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            self._with_lock_retry(lambda: conn.execute("PRAGMA journal_mode = WAL"))
            conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
            conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT_BYTES}")
        except sqlite3.Error as exc:
            self._raise(exc)
        with self._lock:
            self._connections.append(conn)
            self._local.conn = conn
            self._local.generation = self._generation
        return conn

    def _with_lock_retry(self, action: Callable[[], object]) -> None:
        # Switching to WAL or creating the schema can meet "database is locked" while another
        # process does the same on a fresh file; busy_timeout does not cover every such case.
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                action()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc).lower() or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def checkpoint(self) -> bool:
        """Move the WAL into the database and truncate it (``wal_checkpoint(TRUNCATE)``);
        False when it could not complete (a reader, a full disk: the WAL stays, nothing is lost).
        """
        try:
            row = self._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            return False
        return row is not None and row[0] == 0

    def close(self) -> None:
        """Checkpoint, then close every thread's connection. Idempotent; the store reopens on
        next use."""
        with self._lock:
            open_now = bool(self._connections)
        if open_now:
            self.checkpoint()
        with self._lock:
            connections, self._connections = self._connections, []
            self._generation += 1
        for conn in connections:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _raise(self, exc: sqlite3.Error) -> NoReturn:
        if _is_unavailable(exc):
            raise StoreUnavailableError(f"SQLite store {self.path}: {exc}") from exc
        raise exc

    # -- the port ----------------------------------------------------------------------------

    def get(self, name: str) -> OpRecord | None:
        try:
            row = self._conn().execute(f"{_SELECT} WHERE name = ?", (name,)).fetchone()
        except sqlite3.Error as exc:
            self._raise(exc)
        return _record(row) if row else None

    def poll_state(self, name: str) -> PollState | None:
        """The poll state stored beside the record of ``name``, or None."""
        try:
            row = self._conn().execute(f"{_SELECT_DUE} WHERE name = ?", (name,)).fetchone()
        except sqlite3.Error as exc:
            self._raise(exc)
        return _due(row).poll if row else None

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        values = self._row(record)
        return self._write(
            f"INSERT INTO operations ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(name) DO NOTHING",
            values,
            record.name,
        )

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        # An applied write is a real observation: the not-found streak and the lost mark are
        # cleared, a lost operation rejoins the open index due at once; an open operation keeps
        # its due time (the reconciler sets it) and its overdue mark.
        values = self._row(record)
        open_ns = values[10]
        return self._write(
            "UPDATE operations SET state = ?, rank = ?, update_ns = ?, version = ?, kind = ?, "
            "source = ?, details = ?, created_ns = ?, applied_ns = ?, "
            "open_ns = CASE WHEN ? IS NULL THEN NULL WHEN open_ns IS NULL THEN ? "
            "ELSE open_ns END, "
            "expires_at = ?, poll_misses = 0, poll_missing_since_ns = 0, lost_ns = 0 "
            "WHERE name = ? AND version = ?",
            (*values[1:10], open_ns, open_ns, values[11], record.name, expected_version),
            record.name,
        )

    def list_open(self, limit: int = 100) -> Sequence[OpRecord]:
        if limit <= 0:
            return []
        try:
            rows = (
                self._conn()
                .execute(
                    f"{_SELECT} WHERE open_ns IS NOT NULL ORDER BY open_ns, name LIMIT ?",
                    (limit,),
                )
                .fetchall()
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        return [_record(row) for row in rows]

    def iter_due(self, now_ns: int | None, page_size: int = 100) -> Iterator[Due]:
        """Open, not-lost entries due by ``now_ns`` (None: all), oldest due first, by pages
        of ``page_size`` on the partial index (keyset paging: no transaction held)."""
        after: tuple[str, str] = ("", "")
        upper = _ns_text(now_ns) if now_ns is not None else "9" * _NS_DIGITS
        size = max(1, page_size)
        while True:
            try:
                rows = (
                    self._conn()
                    .execute(
                        f"{_SELECT_DUE} WHERE open_ns IS NOT NULL AND open_ns <= ? "
                        "AND (open_ns, name) > (?, ?) ORDER BY open_ns, name LIMIT ?",
                        (upper, after[0], after[1], size),
                    )
                    .fetchall()
                )
            except sqlite3.Error as exc:
                self._raise(exc)
            for row in rows:
                yield _due(row)
            if len(rows) < size:
                return
            after = (rows[-1][10], rows[-1][0])

    def set_poll(self, name: str, version: int, poll: PollState) -> bool:
        open_ns = None if poll.lost else _ns_text(max(0, poll.due_ns))
        progress = None if poll.progress is None else json.dumps(dict(poll.progress))
        try:
            cursor = self._conn().execute(
                "UPDATE operations SET open_ns = ?, poll_misses = ?, poll_missing_since_ns = ?, "
                "lost_ns = ?, overdue_ns = ?, progress = COALESCE(?, progress) "
                "WHERE name = ? AND version = ? AND expires_at IS NULL",
                (
                    open_ns,
                    poll.misses,
                    poll.missing_since_ns,
                    poll.lost_ns,
                    poll.overdue_ns,
                    progress,
                    name,
                    version,
                ),
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        return bool(cursor.rowcount)

    def iter_marked(self) -> Iterator[Due]:
        try:
            rows = (
                self._conn()
                .execute(
                    f"{_SELECT_DUE} WHERE expires_at IS NULL AND (lost_ns > 0 OR overdue_ns > 0) "
                    "ORDER BY name"
                )
                .fetchall()
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        for row in rows:
            entry = _due(row)
            if not entry.record.terminal:
                yield entry

    def iter_all(self) -> Iterator[OpRecord]:
        """Every record by name, fetched in pages (no read transaction held across yields)."""
        after = ""  # every name is non-empty, so every name sorts after ""
        while True:
            try:
                rows = (
                    self._conn()
                    .execute(
                        f"{_SELECT} WHERE name > ? ORDER BY name LIMIT ?",
                        (after, _PAGE),
                    )
                    .fetchall()
                )
            except sqlite3.Error as exc:
                self._raise(exc)
            for row in rows:
                yield _record(row)
            if len(rows) < _PAGE:
                return
            after = rows[-1][0]

    def get_archive(self, name: str) -> ArchiveState | None:
        try:
            row = (
                self._conn()
                .execute("SELECT archive FROM operations WHERE name = ?", (name,))
                .fetchone()
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        return _archive(row[0]) if row else None

    def set_archive(self, name: str, expected_rev: int, state: ArchiveState) -> bool:
        stored = replace(state, rev=expected_rev + 1)
        try:
            cursor = self._conn().execute(
                "UPDATE operations SET archive = ?, archive_status = ?, archive_rev = ?, "
                "archive_due_ns = ? WHERE name = ? AND expires_at IS NOT NULL "
                "AND created_ns = ? AND archive_rev = ?",
                (
                    json.dumps(stored.as_dict(), sort_keys=True),
                    stored.status,
                    stored.rev,
                    stored.due_ns,
                    name,
                    state.created_ns,
                    expected_rev,
                ),
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        return bool(cursor.rowcount)

    def get_progress(self, name: str) -> dict[str, int] | None:
        try:
            row = (
                self._conn()
                .execute("SELECT progress FROM operations WHERE name = ?", (name,))
                .fetchone()
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        if not row or not row[0]:
            return None
        value = json.loads(row[0])
        return value if isinstance(value, dict) else None

    def iter_archive_due(self, now_ns: int) -> Iterator[ArchiveEntry]:
        """Unsettled terminal records by (due, name), fetched in pages (keyset paging)."""
        after: tuple[int, str] = (-1, "")
        while True:
            try:
                rows = (
                    self._conn()
                    .execute(
                        f"{_SELECT_ARCHIVE}, archive, archive_due_ns FROM operations "
                        "WHERE expires_at IS NOT NULL AND (archive_status IS NULL OR "
                        "(archive_status IN ('pending', 'failed') AND archive_due_ns <= ?)) "
                        "AND (archive_due_ns, name) > (?, ?) "
                        "ORDER BY archive_due_ns, name LIMIT ?",
                        (now_ns, after[0], after[1], _PAGE),
                    )
                    .fetchall()
                )
            except sqlite3.Error as exc:
                self._raise(exc)
            for row in rows:
                yield ArchiveEntry(_record(row), _archive(row[12]))
            if len(rows) < _PAGE:
                return
            after = (int(rows[-1][13]), rows[-1][0])

    # -- extras ------------------------------------------------------------------------------

    def raw_row(self, name: str) -> dict[str, Any] | None:
        """The stored row of ``name`` as a dict of columns (tests, debugging)."""
        conn = self._conn()
        cursor = conn.execute(f"{_SELECT} WHERE name = ?", (name,))
        row = cursor.fetchone()
        if row is None:
            return None
        return {d[0]: v for d, v in zip(cursor.description, row, strict=True)}

    def purge_expired(self, now_s: int | None = None) -> int:
        """Delete terminal records whose ``expires_at`` has passed; returns how many."""
        now = int(time.time()) if now_s is None else now_s
        try:
            conn = self._conn()
            cursor = conn.execute(
                "DELETE FROM operations WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        return int(cursor.rowcount)

    # -- helpers -----------------------------------------------------------------------------

    def _row(self, record: OpRecord) -> tuple[Any, ...]:
        validate_record(record)
        expires: int | None = None
        open_ns: str | None = None
        if record.terminal:
            expires = expires_at(record, self.retention_days, self._clock())
        else:
            open_ns = _ns_text(max(0, initial_due(record)))
        return (
            record.name,
            str(record.state),
            record.rank,
            _ns_text(record.update_time_ns),
            record.version,
            str(record.kind),
            str(record.source),
            json.dumps(dict(record.details), default=str, sort_keys=True),
            record.created_ns,
            record.applied_ns,
            open_ns,
            expires,
        )

    def _write(self, sql: str, params: Sequence[Any], name: str) -> WriteOutcome:
        try:
            return self._write_once(sql, params, name)
        except StoreUnavailableError as exc:
            # Out of space: the WAL may hold what could move into the database (or be cut
            # back), so checkpoint and try once more; else the caller answers 503.
            if not _is_full(exc.__cause__) or not self.checkpoint():
                raise
            return self._write_once(sql, params, name)

    def _write_once(self, sql: str, params: Sequence[Any], name: str) -> WriteOutcome:
        conn = self._conn()
        try:
            if conn.execute(sql, params).rowcount:
                return WRITTEN
            row = conn.execute(f"{_SELECT} WHERE name = ?", (name,)).fetchone()
        except sqlite3.Error as exc:
            self._raise(exc)
        return WriteOutcome(ok=False, current=_record(row) if row else None)


def _due(row: Sequence[Any]) -> Due:
    record = _record(row)
    open_ns = row[10]
    misses, missing_since, lost, overdue = (int(v or 0) for v in row[12:16])
    return Due(
        record,
        PollState(
            due_ns=int(open_ns) if open_ns is not None else 0,
            misses=misses,
            missing_since_ns=missing_since,
            lost_ns=lost,
            overdue_ns=overdue,
        ),
    )


def _archive(text: str | None) -> ArchiveState | None:
    if not text:
        return None
    raw = json.loads(text)
    return ArchiveState.from_dict(raw) if isinstance(raw, dict) else None


def _record(row: Sequence[Any]) -> OpRecord:
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
