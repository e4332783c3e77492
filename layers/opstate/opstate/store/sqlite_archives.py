"""The archiver's side of ``SQLiteStore``: the archive state of a terminal record (its JSON in
``archive``, and the copies the queries filter on: ``archive_status``, ``archive_rev``,
``archive_due_ns``) and a running batch's progress. ``set_archive`` is its own ``UPDATE ...
WHERE archive_rev = ?``: it never touches the record's columns.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import replace

from opstate.store.port import ArchiveEntry, ArchiveState
from opstate.store.sqlite_schema import PAGE, SELECT_ARCHIVE, SQLiteParts, archive_of, record_of


class SQLiteArchives(SQLiteParts):
    """``get_archive``, ``set_archive``, ``get_progress`` and ``iter_archive_due``."""

    def get_archive(self, name: str) -> ArchiveState | None:
        return archive_of(self._cell(name, "archive"))

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
        text = self._cell(name, "progress")
        if not text:
            return None
        value = json.loads(text)
        return value if isinstance(value, dict) else None

    def iter_archive_due(self, now_ns: int) -> Iterator[ArchiveEntry]:
        """Unsettled terminal records by (due, name), fetched in pages (keyset paging)."""
        after: tuple[int, str] = (-1, "")
        while True:
            try:
                rows = (
                    self._conn()
                    .execute(
                        f"{SELECT_ARCHIVE}, archive, archive_due_ns FROM operations "
                        "WHERE expires_at IS NOT NULL AND (archive_status IS NULL OR "
                        "(archive_status IN ('pending', 'failed') AND archive_due_ns <= ?)) "
                        "AND (archive_due_ns, name) > (?, ?) "
                        "ORDER BY archive_due_ns, name LIMIT ?",
                        (now_ns, after[0], after[1], PAGE),
                    )
                    .fetchall()
                )
            except sqlite3.Error as exc:
                self._raise(exc)
            for row in rows:
                yield ArchiveEntry(record_of(row), archive_of(row[12]))
            if len(rows) < PAGE:
                return
            after = (int(rows[-1][13]), rows[-1][0])
