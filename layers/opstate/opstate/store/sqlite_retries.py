"""The retry runner's side of ``SQLiteStore`` (issue 33): the retry state beside any record,
open or terminal (its JSON in ``retry``, and the copies the queries filter on:
``retry_status``, ``retry_rev``, ``retry_due_ns``). ``set_retry`` is its own ``UPDATE ...
WHERE retry_rev = ?``: it never touches the record's columns, its poll state or its archive.
Active roots are listed on the partial index ``operations_retry`` (``retry_due_ns, name``
where ``retry_status = 'active'``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace

from opstate.domain.model import OpRecord
from opstate.store.port import check_retry
from opstate.store.retry_state import RETRY_ACTIVE, RetryState
from opstate.store.sqlite_schema import (
    MAX_SQLITE_INT,
    PAGE,
    SELECT_ARCHIVE,
    SQLiteParts,
    record_of,
    retry_of,
)

MIN_SQLITE_INT = -(2**63)


def _indexed(ns: int) -> int:
    """``ns`` as the integer column can hold it (cut to SQLite's range)."""
    return max(MIN_SQLITE_INT, min(MAX_SQLITE_INT, ns))


class SQLiteRetries(SQLiteParts):
    """``get_retry``, ``set_retry`` and ``iter_retry_due``."""

    def get_retry(self, name: str) -> RetryState | None:
        return retry_of(self._cell(name, "retry"))

    def set_retry(self, name: str, expected_rev: int, state: RetryState) -> bool:
        stored = replace(state, rev=expected_rev + 1)
        text = check_retry(stored)  # refused before the store is called
        if _indexed(state.created_ns) != state.created_ns or _indexed(expected_rev) != expected_rev:
            return False  # no row can hold such a value: the condition fails
        try:
            cursor = self._conn().execute(
                "UPDATE operations SET retry = ?, retry_status = ?, retry_rev = ?, "
                "retry_due_ns = ? WHERE name = ? AND created_ns = ? AND retry_rev = ?",
                (
                    text,
                    stored.status,
                    stored.rev,
                    _indexed(stored.due_ns),
                    name,
                    state.created_ns,
                    expected_rev,
                ),
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        return bool(cursor.rowcount)

    def iter_retry_due(self, now_ns: int) -> Iterator[tuple[OpRecord, RetryState]]:
        """Active retry roots due by ``now_ns``, by (due, name), fetched in pages on the
        partial index (keyset paging: no read transaction held across yields)."""
        upper = _indexed(now_ns)
        after: tuple[int, str] = (MIN_SQLITE_INT, "")  # every name is non-empty
        while True:
            try:
                rows = (
                    self._conn()
                    .execute(
                        f"{SELECT_ARCHIVE}, retry, retry_due_ns FROM operations "
                        # The literal (not a parameter) lets SQLite use the partial index.
                        f"WHERE retry_status = '{RETRY_ACTIVE}' AND retry_due_ns <= ? "
                        "AND (retry_due_ns, name) > (?, ?) "
                        "ORDER BY retry_due_ns, name LIMIT ?",
                        (upper, after[0], after[1], PAGE),
                    )
                    .fetchall()
                )
            except sqlite3.Error as exc:
                self._raise(exc)
            for row in rows:
                state = retry_of(row[12])
                if state is not None and state.active and state.due_ns <= now_ns:
                    yield record_of(row), state
            if len(rows) < PAGE:
                return
            after = (int(rows[-1][13]), rows[-1][0])
