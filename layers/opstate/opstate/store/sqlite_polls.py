"""The reconciler's side of ``SQLiteStore``: the open operations (a partial index on
``(open_ns, name)``: ``open_ns`` is when the operation is next due, NULL once it is terminal or
lost) and the poll state kept beside each record.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence

from opstate.domain.model import OpRecord
from opstate.store.port import Due, PollState
from opstate.store.sqlite_schema import (
    NS_DIGITS,
    SELECT,
    SELECT_DUE,
    SQLiteParts,
    due_of,
    ns_text,
    record_of,
)


class SQLitePolls(SQLiteParts):
    """``poll_state``, ``list_open``, ``iter_due``, ``set_poll`` and ``iter_marked``."""

    def poll_state(self, name: str) -> PollState | None:
        """The poll state stored beside the record of ``name``, or None."""
        try:
            row = self._conn().execute(f"{SELECT_DUE} WHERE name = ?", (name,)).fetchone()
        except sqlite3.Error as exc:
            self._raise(exc)
        return due_of(row).poll if row else None

    def list_open(self, limit: int = 100) -> Sequence[OpRecord]:
        if limit <= 0:
            return []
        try:
            rows = (
                self._conn()
                .execute(
                    f"{SELECT} WHERE open_ns IS NOT NULL ORDER BY open_ns, name LIMIT ?",
                    (limit,),
                )
                .fetchall()
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        return [record_of(row) for row in rows]

    def iter_due(self, now_ns: int | None, page_size: int = 100) -> Iterator[Due]:
        """Open, not-lost entries due by ``now_ns`` (None: all), oldest due first, by pages
        of ``page_size`` on the partial index (keyset paging: no transaction held)."""
        after: tuple[str, str] = ("", "")
        upper = ns_text(now_ns) if now_ns is not None else "9" * NS_DIGITS
        size = max(1, page_size)
        while True:
            try:
                rows = (
                    self._conn()
                    .execute(
                        f"{SELECT_DUE} WHERE open_ns IS NOT NULL AND open_ns <= ? "
                        "AND (open_ns, name) > (?, ?) ORDER BY open_ns, name LIMIT ?",
                        (upper, after[0], after[1], size),
                    )
                    .fetchall()
                )
            except sqlite3.Error as exc:
                self._raise(exc)
            for row in rows:
                yield due_of(row)
            if len(rows) < size:
                return
            after = (rows[-1][10], rows[-1][0])

    def set_poll(self, name: str, version: int, poll: PollState) -> bool:
        open_ns = None if poll.lost else ns_text(max(0, poll.due_ns))
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
                    f"{SELECT_DUE} WHERE expires_at IS NULL AND (lost_ns > 0 OR overdue_ns > 0) "
                    "ORDER BY name"
                )
                .fetchall()
            )
        except sqlite3.Error as exc:
            self._raise(exc)
        for row in rows:
            entry = due_of(row)
            if not entry.record.terminal:
                yield entry
