"""``SQLiteQuarantine``: a ``quarantine`` table in a SQLite file (``opstate serve``: the SQLite
store's own file, else ``.opstate/quarantine.db``), one entry per ``webhook-id`` (Gemini's
retries of a delivery are one entry) and bounded (``OPSTATE_QUARANTINE_MAX_ENTRIES`` /
``OPSTATE_QUARANTINE_MAX_BYTES`` of bodies); when full, ``put`` raises
``QuarantineFullError``: the webhook answers 503, Gemini retries later. One short connection
per call; the file is created 0600 and never opened outside SQLite (``private_files``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from opstate.private_files import create_database_file
from opstate.quarantine.port import (
    Bounds,
    Delivery,
    Kept,
    QuarantineUnavailableError,
    tried_mark,
)

if TYPE_CHECKING:
    import sqlite3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS quarantine (
    id          TEXT PRIMARY KEY,
    received_ns TEXT NOT NULL,
    message     TEXT NOT NULL
)
"""
# Added by this release (a table an older one wrote gets them, filled from its messages):
# the webhook-id (one entry each), the reason and body size (listing without reading bodies),
# the last time a replay walked past it.
_COLUMNS = {
    "webhook_id": "TEXT",
    "reason": "TEXT",
    "bytes": "INTEGER NOT NULL DEFAULT -1",
    "tried_ns": "INTEGER NOT NULL DEFAULT 0",
}
_INDEXES = (
    "CREATE UNIQUE INDEX IF NOT EXISTS quarantine_webhook_id ON quarantine (webhook_id)",
    "CREATE INDEX IF NOT EXISTS quarantine_order ON quarantine (tried_ns, received_ns, id)",
)


class SQLiteQuarantine:
    """A ``quarantine`` table in a SQLite file (may be the store's own file; created 0600)."""

    def __init__(
        self, path: str | Path, *, busy_timeout_s: float = 5.0, bounds: Bounds | None = None
    ) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.bounds = bounds if bounds is not None else Bounds()
        self._lock = threading.Lock()
        create_database_file(self.path)  # 0600 from the first byte, never opened here
        with self._connect() as conn:
            conn.execute(_SCHEMA)
            self._migrate(conn)

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Add this release's columns to a table an older release wrote, filled in from its
        messages; of several entries for one webhook-id the oldest keeps the id."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            have = {row[1] for row in conn.execute("PRAGMA table_info(quarantine)")}
            for column, decl in _COLUMNS.items():
                if column not in have:
                    conn.execute(f"ALTER TABLE quarantine ADD COLUMN {column} {decl}")
            rows = conn.execute(
                "SELECT id, message FROM quarantine WHERE bytes < 0 ORDER BY received_ns, id"
            ).fetchall()
            taken = {
                r[0] for r in conn.execute("SELECT webhook_id FROM quarantine WHERE bytes >= 0")
            }
            for row_id, message in rows:
                try:
                    d = Delivery.from_json(message)
                except ValueError:
                    conn.execute("UPDATE quarantine SET bytes = 0 WHERE id = ?", (row_id,))
                    continue
                webhook_id = d.webhook_id if d.webhook_id not in taken else None
                taken.add(webhook_id)
                conn.execute(
                    "UPDATE quarantine SET webhook_id = ?, reason = ?, bytes = ? WHERE id = ?",
                    (webhook_id, d.reason, len(d.body), row_id),
                )
            for statement in _INDEXES:
                conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        import sqlite3  # here, not at import: the webhook Lambda never uses this class

        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise QuarantineUnavailableError(f"quarantine {self.path}: {exc}") from exc
        try:
            yield conn
        except sqlite3.Error as exc:
            raise QuarantineUnavailableError(f"quarantine {self.path}: {exc}") from exc
        finally:
            conn.close()

    def put(self, delivery: Delivery) -> str:
        with self._lock, self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                kept_id = self._put(conn, delivery)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return kept_id

    def _put(self, conn: sqlite3.Connection, delivery: Delivery) -> str:
        if delivery.webhook_id is not None:
            row = conn.execute(
                "SELECT id FROM quarantine WHERE webhook_id = ?", (delivery.webhook_id,)
            ).fetchone()
            if row is not None:
                return str(row[0])  # Gemini's retry of a delivery kept already
        entries, body_bytes = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(MAX(bytes, 0)), 0) FROM quarantine"
        ).fetchone()
        self.bounds.check(int(entries), int(body_bytes), len(delivery.body))
        conn.execute(
            "INSERT INTO quarantine (id, received_ns, message, webhook_id, reason, bytes) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                delivery.id,
                f"{delivery.received_ns:021d}",
                delivery.to_json(),
                delivery.webhook_id,
                delivery.reason,
                len(delivery.body),
            ),
        )
        return delivery.id

    def take(self, limit: int = 10) -> list[Kept]:
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT id, message FROM quarantine ORDER BY tried_ns, received_ns, id LIMIT ?",
                (limit,),
            ).fetchall()
        out: list[Kept] = []
        for row_id, message in rows:
            try:
                out.append(Kept(Delivery.from_json(message), str(row_id)))
            except ValueError:
                self._mark(str(row_id))  # not ours: walked past, left for an operator
        return out

    def remove(self, kept: Kept) -> None:
        with self._lock, self._connect() as conn:
            conn.execute("DELETE FROM quarantine WHERE id = ?", (kept.handle,))

    def skip(self, kept: Kept) -> None:
        self._mark(kept.handle)

    def _mark(self, row_id: str) -> None:
        with self._lock, self._connect() as conn:
            conn.execute("UPDATE quarantine SET tried_ns = ? WHERE id = ?", (tried_mark(), row_id))

    def entries(self, limit: int = 1000) -> list[Delivery]:
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT message FROM quarantine ORDER BY received_ns, id LIMIT ?", (limit,)
            ).fetchall()
        out: list[Delivery] = []
        for (message,) in rows:
            with contextlib.suppress(ValueError):
                out.append(Delivery.from_json(message))
        return out

    def count(self) -> int:
        with self._connect() as conn:
            (n,) = conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()
        return int(n)


DEFAULT_LOCAL_QUARANTINE = Path(".opstate") / "quarantine.db"


def local_quarantine_path(store_url: str) -> Path:
    """Where ``opstate serve`` keeps quarantined deliveries: a ``quarantine`` table in the
    SQLite store's own file (``sqlite:///PATH``), else ``.opstate/quarantine.db``."""
    scheme, sep, rest = store_url.strip().partition("://")
    if sep and scheme.lower() == "sqlite" and rest.startswith("/") and len(rest) > 1:
        return Path(rest[1:]).expanduser()
    return DEFAULT_LOCAL_QUARANTINE


def local_quarantine(store_url: str, bounds: Bounds | None = None) -> SQLiteQuarantine:
    """The local quarantine beside the store (its folder 0700, its file 0600)."""
    return SQLiteQuarantine(local_quarantine_path(store_url), bounds=bounds)
