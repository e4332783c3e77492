"""A faithful Python port of the seed article's monotonic-apply algorithm (the baseline).

The article (``/work/shared/seed/monotonic-apply-article.ja.txt``, TypeScript + better-sqlite3)
is ported rule for rule, bugs included, so the benchmark can show what they cost:

- ``updateTime`` is kept as the raw RFC3339 text and compared as text (``<=`` on strings), so
  ``"...00.5Z"`` sorts before ``"...00Z"`` and offsets (``+09:00``) compare by wall-clock digits;
- unknown states rank -1; same rank needs a strictly greater ``updateTime`` string;
- ``ingest`` reads, reduces, then ``INSERT OR IGNORE`` / ``UPDATE ... WHERE version = ?`` and
  retries at most ``max_retry`` (4) times with no backoff, then returns
  ``{"applied": False, "reason": "max-retry-exceeded"}``;
- the webhook handler answers 200 whatever ``ingest`` returned (also after
  ``max-retry-exceeded``: the sender never retries, the event is lost) and enqueues the side
  effect after the write, only when applied.

Each thread uses its own SQLite connection to one WAL file: several webhook receivers behind a
load balancer. ``before_write`` is the benchmark's hook between the read and the conditional
write (where a concurrent writer can slip in); it is not part of the seed.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

STATE_RANK: dict[str, int] = {
    "PENDING": 0,
    "RUNNING": 1,
    "SUCCEEDED": 2,
    "FAILED": 2,
    "CANCELLED": 2,
}
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def rank_of(state: str) -> int:
    return STATE_RANK.get(state, -1)


@dataclass(frozen=True)
class SeedOpState:
    name: str
    state: str
    update_time: str  # RFC3339 text, compared as text (the seed's bug)
    version: int


@dataclass(frozen=True)
class SeedEvent:
    name: str
    state: str
    update_time: str


@dataclass(frozen=True)
class SeedResult:
    applied: bool
    reason: str = ""
    next: SeedOpState | None = None


def apply_event(cur: SeedOpState, ev: SeedEvent) -> SeedResult:
    """The article's ``applyEvent``, rule for rule."""
    # 1) terminal: every non-terminal event is ignored
    if cur.state in TERMINAL and ev.state not in TERMINAL:
        return SeedResult(False, "regress-from-terminal")
    cur_rank, ev_rank = rank_of(cur.state), rank_of(ev.state)
    # 2) lower rank is dropped
    if ev_rank < cur_rank:
        return SeedResult(False, "lower-rank")
    # 3) same rank: only a newer updateTime passes -- compared as strings
    if ev_rank == cur_rank and ev.update_time <= cur.update_time:
        return SeedResult(False, "stale-or-equal-update-time")
    # 4) forward
    return SeedResult(
        True,
        "",
        replace(cur, state=ev.state, update_time=ev.update_time, version=cur.version + 1),
    )


_SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    name        TEXT PRIMARY KEY,
    state       TEXT NOT NULL,
    update_time TEXT NOT NULL,
    version     INTEGER NOT NULL
)
"""


@dataclass
class SeedApp:
    """The seed's database, ``ingest`` and webhook handler, one connection per thread."""

    path: str
    max_retry: int = 4
    before_write: Callable[[], None] | None = None
    side_effects: list[SeedOpState] = field(default_factory=list)
    _local: threading.local = field(default_factory=threading.local)
    _conns: list[sqlite3.Connection] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        db = self._db()
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(_SCHEMA)

    def _db(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # autocommit, like better-sqlite3's statement-at-a-time use in the article
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30
            )
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def ingest(self, ev: SeedEvent) -> SeedResult:
        db = self._db()
        for _attempt in range(self.max_retry):
            row = db.execute(
                "SELECT name, state, update_time, version FROM operations WHERE name = ?",
                (ev.name,),
            ).fetchone()
            if self.before_write is not None:
                self.before_write()
            if row is None:
                ins = db.execute(
                    "INSERT OR IGNORE INTO operations(name, state, update_time, version) "
                    "VALUES(?, ?, ?, 1)",
                    (ev.name, ev.state, ev.update_time),
                )
                if ins.rowcount == 1:
                    return SeedResult(True, "", SeedOpState(ev.name, ev.state, ev.update_time, 1))
                continue  # someone inserted concurrently: read again and retry
            cur = SeedOpState(row[0], row[1], row[2], row[3])
            res = apply_event(cur, ev)
            if not res.applied:
                return res  # a backward event: dropped, "success"
            assert res.next is not None
            upd = db.execute(
                "UPDATE operations SET state = ?, update_time = ?, version = ? "
                "WHERE name = ? AND version = ?",
                (res.next.state, res.next.update_time, res.next.version, ev.name, cur.version),
            )
            if upd.rowcount == 1:
                return res
            # lost the race: back to the top, read again
        return SeedResult(False, "max-retry-exceeded")

    def enqueue_side_effect(self, state: SeedOpState) -> None:
        with self._lock:
            self.side_effects.append(state)

    def handle_webhook(self, body: dict[str, Any]) -> int:
        """``POST /gemini/webhook`` after the signature check: always 200."""
        ev = SeedEvent(str(body["name"]), str(body["state"]), str(body["updateTime"]))
        result = self.ingest(ev)
        if result.applied and result.next is not None:
            self.enqueue_side_effect(result.next)
        return 200  # also after max-retry-exceeded: the event is silently lost

    def get(self, name: str) -> SeedOpState | None:
        row = (
            self._db()
            .execute(
                "SELECT name, state, update_time, version FROM operations WHERE name = ?", (name,)
            )
            .fetchone()
        )
        return None if row is None else SeedOpState(row[0], row[1], row[2], row[3])

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
