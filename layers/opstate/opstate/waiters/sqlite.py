"""Waiters in a table of their own (``waiters``) in the SQLite store's file.

The ``operations`` table is never touched: a waiter changes no record, version or event. One
short connection per call (waiters are few and rare next to ingest); ``add`` counts and
inserts in one ``BEGIN IMMEDIATE`` transaction, so the bound holds across processes.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

from opstate.private_files import create_database_file
from opstate.waiters.model import Target, Waiter, When
from opstate.waiters.port import TooManyWaitersError, WaiterStoreUnavailableError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS waiters (
    name TEXT NOT NULL,
    waiter_id TEXT NOT NULL,
    target TEXT NOT NULL,
    token TEXT NOT NULL,
    condition TEXT NOT NULL,
    created_ns INTEGER NOT NULL,
    PRIMARY KEY (name, waiter_id)
) WITHOUT ROWID;
"""
_BUSY_TIMEOUT_S = 5.0


class SQLiteWaiterStore:
    """The waiter store on one SQLite file (the record store's own file, as a rule)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        create_database_file(self.path)  # 0600 from the first byte, never opened here
        with self._conn() as conn:
            conn.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise WaiterStoreUnavailableError(f"SQLite waiters {self.path}: {exc}") from exc
        try:
            yield conn
        except sqlite3.OperationalError as exc:
            raise WaiterStoreUnavailableError(f"SQLite waiters {self.path}: {exc}") from exc
        finally:
            conn.close()

    def add(self, waiter: Waiter, limit: int) -> bool:
        with self._conn() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.execute(
                    "SELECT 1 FROM waiters WHERE name = ? AND waiter_id = ?",
                    (waiter.name, waiter.waiter_id),
                ).fetchone():
                    return False
                (count,) = conn.execute(
                    "SELECT COUNT(*) FROM waiters WHERE name = ?", (waiter.name,)
                ).fetchone()
                if count >= limit:
                    raise TooManyWaitersError(f"{waiter.name} already has {count} waiter(s)")
                conn.execute(
                    "INSERT INTO waiters VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        waiter.name,
                        waiter.waiter_id,
                        str(waiter.target),
                        waiter.token,
                        str(waiter.when),
                        waiter.created_ns,
                    ),
                )
                conn.execute("COMMIT")
                return True
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")

    def list(self, name: str) -> Sequence[Waiter]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT name, target, token, condition, created_ns FROM waiters "
                "WHERE name = ? ORDER BY created_ns, waiter_id",
                (name,),
            ).fetchall()
        return [
            Waiter(name=n, target=Target(t), token=tok, when=When(w), created_ns=int(c))
            for n, t, tok, w, c in rows
        ]

    def remove(self, name: str, waiter_id: str) -> None:
        with self._conn() as conn:
            conn.execute("DELETE FROM waiters WHERE name = ? AND waiter_id = ?", (name, waiter_id))

    def close(self) -> None:
        return None
