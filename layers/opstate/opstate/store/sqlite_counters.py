"""The counters of ``SQLiteStore`` (``store.counters``): one row per counter in ``counters``,
added to by one upsert whose update is conditional on the cap (one statement: atomic against
every other connection to the file)."""

from __future__ import annotations

import sqlite3

from opstate.store.sqlite_schema import MAX_SQLITE_INT, SQLiteParts


class SQLiteCounters(SQLiteParts):
    """``add_counter`` and ``get_counter``."""

    def add_counter(self, counter: str, amount: int, cap: int) -> bool:
        if amount < 0:
            raise ValueError("a counter is only added to")
        if amount > cap or cap > MAX_SQLITE_INT:
            return False
        try:
            cursor = self._conn().execute(
                "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE "
                "SET value = value + excluded.value WHERE value + excluded.value <= ?",
                (counter, amount, cap),
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        return cursor.rowcount == 1

    def get_counter(self, counter: str) -> int:
        try:
            row = (
                self._conn()
                .execute("SELECT value FROM counters WHERE name = ?", (counter,))
                .fetchone()
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        return int(row[0]) if row else 0
