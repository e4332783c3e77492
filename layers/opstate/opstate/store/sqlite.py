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
- The retry state beside any record (``RetryState``, issue 33): ``retry`` (its JSON) and the
  copies ``retry_status``, ``retry_rev`` and ``retry_due_ns``, added on open like the others,
  then the partial index ``operations_retry`` on ``(retry_due_ns, name)`` of the active ones.
  ``set_retry`` is its own ``UPDATE ... WHERE retry_rev = ?``; a replace never touches them.
- Times in ns are stored as zero-padded decimal text: SQLite integers stop at 2**63 (year 2262)
  and the model accepts instants up to year 9999; fixed-width digits sort as numbers.
- ``details`` is JSON text. ``expires_at`` (epoch seconds) is kept for terminal records, as on
  DynamoDB; ``purge_expired`` deletes what is past it (SQLite has no TTL of its own).

"database is locked", busy, disk and I/O errors raise ``StoreUnavailableError``; SQL errors are
bugs and propagate.

This module holds the connections and the records; ``sqlite_schema`` the table, the columns
added on open and the row codecs; ``sqlite_polls`` the open index and the poll state (the
reconciler's side); ``sqlite_archives`` the archive state (the archiver's side);
``sqlite_retries`` the retry state (the retry runner's side).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from opstate.config import DEFAULT_RETENTION_DAYS
from opstate.domain.model import OpRecord
from opstate.private_files import create_database_file
from opstate.store.port import (
    WRITTEN,
    StoreUnavailableError,
    WriteOutcome,
    expires_at,
    initial_due,
    validate_record,
)
from opstate.store.sqlite_archives import SQLiteArchives
from opstate.store.sqlite_counters import SQLiteCounters
from opstate.store.sqlite_polls import SQLitePolls
from opstate.store.sqlite_retries import SQLiteRetries
from opstate.store.sqlite_schema import (
    COLUMNS,
    PAGE,
    SCHEMA,
    SELECT,
    add_poll_columns,
    is_full,
    is_unavailable,
    ns_text,
    record_of,
)

DEFAULT_BUSY_TIMEOUT_S = 5.0
WAL_AUTOCHECKPOINT_PAGES = 100
JOURNAL_SIZE_LIMIT_BYTES = 1024 * 1024
SYNCHRONOUS = "FULL"


class SQLiteStore(SQLitePolls, SQLiteArchives, SQLiteRetries, SQLiteCounters):
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
            self._with_lock_retry(lambda: conn.executescript(SCHEMA))
            self._with_lock_retry(lambda: add_poll_columns(conn))
        except sqlite3.Error as exc:
            self._raise(exc)

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
        if is_unavailable(exc):
            raise StoreUnavailableError(f"SQLite store {self.path}: {exc}") from exc
        raise exc

    # -- the port ----------------------------------------------------------------------------

    def get(self, name: str) -> OpRecord | None:
        try:
            row = self._conn().execute(f"{SELECT} WHERE name = ?", (name,)).fetchone()
        except sqlite3.Error as exc:
            self._raise(exc)
        return record_of(row) if row else None

    def get_many(self, names: Sequence[str]) -> dict[str, OpRecord]:
        """One SELECT per 500 names (SQLite's bound on parameters is far above that)."""
        unique = list(dict.fromkeys(names))
        found: dict[str, OpRecord] = {}
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            try:
                rows = self._conn().execute(f"{SELECT} WHERE name IN ({marks})", chunk).fetchall()
            except sqlite3.Error as exc:
                self._raise(exc)
            for row in rows:
                record = record_of(row)
                found[record.name] = record
        return found

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        values = self._row(record)
        return self._write(
            f"INSERT INTO operations ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
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

    def iter_all(self) -> Iterator[OpRecord]:
        """Every record by name, fetched in pages (no read transaction held across yields)."""
        after = ""  # every name is non-empty, so every name sorts after ""
        while True:
            try:
                rows = (
                    self._conn()
                    .execute(
                        f"{SELECT} WHERE name > ? ORDER BY name LIMIT ?",
                        (after, PAGE),
                    )
                    .fetchall()
                )
            except sqlite3.Error as exc:
                self._raise(exc)
            for row in rows:
                yield record_of(row)
            if len(rows) < PAGE:
                return
            after = rows[-1][0]

    # -- extras ------------------------------------------------------------------------------

    def raw_row(self, name: str) -> dict[str, Any] | None:
        """The stored row of ``name`` as a dict of columns (tests, debugging)."""
        conn = self._conn()
        cursor = conn.execute(f"{SELECT} WHERE name = ?", (name,))
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
            open_ns = ns_text(max(0, initial_due(record)))
        return (
            record.name,
            str(record.state),
            record.rank,
            ns_text(record.update_time_ns),
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
            if not is_full(exc.__cause__) or not self.checkpoint():
                raise
            return self._write_once(sql, params, name)

    def _write_once(self, sql: str, params: Sequence[Any], name: str) -> WriteOutcome:
        conn = self._conn()
        try:
            if conn.execute(sql, params).rowcount:
                return WRITTEN
            row = conn.execute(f"{SELECT} WHERE name = ?", (name,)).fetchone()
        except sqlite3.Error as exc:
            self._raise(exc)
        return WriteOutcome(ok=False, current=record_of(row) if row else None)
