"""The quarantine: signed webhook deliveries we could not read, kept for a later replay.

A delivery that passed the signature check is Gemini's. If its body cannot be turned into an
event (not JSON Python can read, a known type with a shape the normaliser does not know yet, a
name or time it refuses), refusing it with a 4xx would make Gemini retry for a day and then
disable the endpoint, losing every later event. So the raw delivery is kept here, the webhook
answers 200 (``applied: false``, ``reason: quarantined``), and ``opstate replay`` re-ingests
the kept deliveries once the normaliser learns their shape.

What proves a kept delivery was Gemini's travels with it: the headers that were verified
(``proof``: ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``, or the JWT header of
a dynamic webhook). ``opstate replay`` verifies them again over the exact body (without the
timestamp tolerance) and refuses anything that fails, so a message written into the queue by
anyone else is never applied (``opstate.replay``; docs/security.md argues the choice).

Implementations (all behind ``Quarantine``):
- ``SqsQuarantine``: an SQS queue (production; ``OPSTATE_QUARANTINE_QUEUE_URL``); its resource
  policy lets only the webhook function send; its own limits bound it, and an alarm fires on
  every delivery kept;
- ``SQLiteQuarantine``: a table in a SQLite file (``opstate serve``): one entry per
  ``webhook-id`` (Gemini's retries of a delivery are one entry) and bounded
  (``OPSTATE_QUARANTINE_MAX_ENTRIES`` / ``OPSTATE_QUARANTINE_MAX_BYTES`` of bodies); when full,
  ``put`` raises ``QuarantineFullError``: the webhook answers 503, Gemini retries later;
- ``MemoryQuarantine``: tests (same dedupe and bounds);
- ``LogQuarantine``: no queue configured: the delivery is logged whole at error level (base64),
  so it is at least recoverable from the logs.

A replay walks past what it leaves kept (``skip``): the next ``take`` returns the deliveries
tried least recently first (SQLite: a ``tried_ns`` mark; SQS: the message stays hidden for
``SKIP_VISIBILITY_S``), so ``replay --limit N`` run again reaches every delivery.

A message is JSON: ``{"v": 1, "id", "webhookId", "receivedAt", "reason", "message",
"headers": {proof}, "body": <base64 of the exact bytes>}`` (``headers`` is new in this release;
a message without it was kept by an older one and cannot be verified). ``put`` raises
``QuarantineUnavailableError`` (a ``RetryableError``: the webhook answers 503 and Gemini
retries) when the delivery could not be kept; it is never acknowledged otherwise.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from opstate.config import DEFAULT_QUARANTINE_MAX_BYTES, DEFAULT_QUARANTINE_MAX_ENTRIES
from opstate.domain.strict_json import InvalidJSONError, loads
from opstate.domain.times import format_time
from opstate.private_files import create_database_file
from opstate.store.port import RetryableError

if TYPE_CHECKING:
    import sqlite3

FORMAT_VERSION = 1
# How long a delivery a replay walked past stays hidden in SQS (the local marks need no wait).
SKIP_VISIBILITY_S = 15 * 60
# The proof headers kept are bounded like the live verifier bounds them (a JWT is the longest).
MAX_PROOF_HEADER_LENGTH = 16384


class QuarantineUnavailableError(RetryableError):
    """The delivery could not be kept: the sender must retry."""


class QuarantineFullError(QuarantineUnavailableError):
    """The local quarantine holds its maximum (entries or bytes): the sender must retry later,
    after an operator replayed or removed what is kept."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The most a local quarantine keeps: entries, and bytes of kept bodies."""

    max_entries: int = DEFAULT_QUARANTINE_MAX_ENTRIES
    max_bytes: int = DEFAULT_QUARANTINE_MAX_BYTES

    def check(self, entries: int, body_bytes: int, adding: int) -> None:
        if entries + 1 > self.max_entries:
            raise QuarantineFullError(
                f"the quarantine is full ({entries} deliveries, the most "
                "OPSTATE_QUARANTINE_MAX_ENTRIES allows): replay or remove what it keeps"
            )
        if body_bytes + adding > self.max_bytes:
            raise QuarantineFullError(
                f"the quarantine is full ({body_bytes} bytes kept, {adding} more would pass "
                "OPSTATE_QUARANTINE_MAX_BYTES): replay or remove what it keeps"
            )


UNBOUNDED = Bounds(max_entries=2**62, max_bytes=2**62)


def _proof_pairs(headers: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    if not headers:
        return ()
    return tuple(
        sorted(
            (str(k).lower(), v)
            for k, v in headers.items()
            if isinstance(v, str) and len(v) <= MAX_PROOF_HEADER_LENGTH
        )
    )


@dataclass(frozen=True, slots=True)
class Delivery:
    """One signed delivery we could not read: its exact body, why it was not read, and the
    headers that proved it was Gemini's (``proof``; empty when an older release kept it)."""

    id: str
    webhook_id: str | None
    received_ns: int
    reason: str
    message: str
    body: bytes
    proof: tuple[tuple[str, str], ...] = ()

    @classmethod
    def new(
        cls,
        body: bytes,
        *,
        webhook_id: str | None,
        reason: str,
        message: str,
        received_ns: int,
        proof: Mapping[str, str] | None = None,
    ) -> Delivery:
        return cls(
            uuid.uuid4().hex,
            webhook_id,
            received_ns,
            reason,
            message[:1000],
            body,
            _proof_pairs(proof),
        )

    @property
    def headers(self) -> dict[str, str]:
        """The proof headers, for a verifier."""
        return dict(self.proof)

    def to_json(self) -> str:
        # ASCII (json's default): an SQS message body allows only some Unicode characters.
        return json.dumps(
            {
                "v": FORMAT_VERSION,
                "id": self.id,
                "webhookId": self.webhook_id,
                "receivedAt": format_time(self.received_ns),
                "receivedNs": self.received_ns,
                "reason": self.reason,
                "message": self.message,
                "headers": self.headers,
                "body": base64.b64encode(self.body).decode("ascii"),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Delivery:
        """A delivery from its message text (``strict_json``); ``ValueError`` for anything
        else."""
        try:
            doc = loads(text)
            if not isinstance(doc, Mapping) or doc.get("v") != FORMAT_VERSION:
                raise ValueError("not a quarantined delivery (v1)")
            webhook_id = doc.get("webhookId")
            headers = doc.get("headers")
            return cls(
                id=str(doc["id"]),
                webhook_id=webhook_id if isinstance(webhook_id, str) else None,
                received_ns=int(doc.get("receivedNs") or 0),
                reason=str(doc.get("reason", "")),
                message=str(doc.get("message", "")),
                body=base64.b64decode(str(doc["body"]), validate=True),
                proof=_proof_pairs(headers if isinstance(headers, Mapping) else None),
            )
        except InvalidJSONError as exc:
            raise ValueError(f"not a quarantined delivery: {exc.message}") from None
        except (KeyError, TypeError, binascii.Error, UnicodeDecodeError, OverflowError) as exc:
            raise ValueError(f"not a quarantined delivery: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class Kept:
    """A delivery read back from a quarantine, with the handle that removes it."""

    delivery: Delivery
    handle: str


class Quarantine(Protocol):
    def put(self, delivery: Delivery) -> str:
        """Keep ``delivery``; returns the id it is kept under (an earlier entry's id when one
        with the same ``webhook-id`` is kept already). ``QuarantineUnavailableError`` if it
        could not be kept (``QuarantineFullError``: the quarantine is full)."""
        ...

    def take(self, limit: int = 10) -> list[Kept]:
        """Up to ``limit`` kept deliveries, least recently tried first (SQS: hidden from other
        readers for a while)."""
        ...

    def remove(self, kept: Kept) -> None:
        """Forget a delivery that was replayed."""
        ...

    def skip(self, kept: Kept) -> None:
        """A replay leaves ``kept`` in place: the next ``take`` reaches the others first."""
        ...

    def entries(self, limit: int = 1000) -> list[Delivery]:
        """Up to ``limit`` kept deliveries, oldest first, to list them (nothing changes)."""
        ...


class MemoryQuarantine:
    def __init__(self, bounds: Bounds = UNBOUNDED) -> None:
        self.bounds = bounds
        self._items: dict[str, Delivery] = {}
        self._tried: dict[str, int] = {}
        self._lock = threading.Lock()

    def put(self, delivery: Delivery) -> str:
        with self._lock:
            for kept in self._items.values():
                if delivery.webhook_id is not None and kept.webhook_id == delivery.webhook_id:
                    return kept.id
            total = sum(len(d.body) for d in self._items.values())
            self.bounds.check(len(self._items), total, len(delivery.body))
            self._items[delivery.id] = delivery
            return delivery.id

    def take(self, limit: int = 10) -> list[Kept]:
        with self._lock:
            items = sorted(
                self._items.values(),
                key=lambda d: (self._tried.get(d.id, 0), d.received_ns, d.id),
            )
        return [Kept(d, d.id) for d in items[:limit]]

    def remove(self, kept: Kept) -> None:
        with self._lock:
            self._items.pop(kept.handle, None)
            self._tried.pop(kept.handle, None)

    def skip(self, kept: Kept) -> None:
        with self._lock:
            if kept.handle in self._items:
                self._tried[kept.handle] = _mark()

    def entries(self, limit: int = 1000) -> list[Delivery]:
        with self._lock:
            return sorted(self._items.values(), key=lambda d: (d.received_ns, d.id))[:limit]

    def all(self) -> list[Delivery]:
        return self.entries(limit=len(self._items) or 1)


_LAST_MARK = [0]
_MARK_LOCK = threading.Lock()


def _mark() -> int:
    """A strictly increasing wall-clock mark (ns) for "tried at"."""
    with _MARK_LOCK:
        _LAST_MARK[0] = max(time.time_ns(), _LAST_MARK[0] + 1)
        return _LAST_MARK[0]


class LogQuarantine:
    """No quarantine configured: the delivery is logged whole (base64 body) at error level."""

    def put(self, delivery: Delivery) -> str:
        from opstate.observability import logger

        # Without its proof: signatures and tokens are never logged (opstate.observability).
        # A delivery recovered from the log is replayed by hand (opstate replay FILE).
        logger.error(
            "webhook quarantined to the log (no quarantine queue configured)",
            extra={"quarantined_delivery": dataclasses.replace(delivery, proof=()).to_json()},
        )
        return delivery.id

    def take(self, limit: int = 10) -> list[Kept]:
        return []

    def remove(self, kept: Kept) -> None:
        return None

    def skip(self, kept: Kept) -> None:
        return None

    def entries(self, limit: int = 1000) -> list[Delivery]:
        return []


class SqsQuarantine:
    """An SQS queue. ``take`` receives with a visibility timeout: a delivery not removed
    (its replay failed) comes back after it; ``skip`` hides it for ``SKIP_VISIBILITY_S``.

    Without ``client``, the SQS client is built on first use, not here: the webhook builds its
    quarantine at init, and most cold starts never quarantine anything, so building the client
    (loading SQS's service model) there would only lengthen every cold start (docs/deploy.md,
    "Import only what the first request needs")."""

    def __init__(
        self, queue_url: str, *, client: Any = None, visibility_timeout_s: int = 60
    ) -> None:
        self.queue_url = queue_url
        self.visibility_timeout_s = visibility_timeout_s
        self._client: Any = client
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The SQS client (built on first use when none was given)."""
        with self._client_lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                self._client = boto3.client(
                    "sqs",
                    config=Config(
                        retries={"mode": "standard", "total_max_attempts": 3},
                        connect_timeout=2,
                        read_timeout=5,
                    ),
                )
            return self._client

    def put(self, delivery: Delivery) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.send_message(QueueUrl=self.queue_url, MessageBody=delivery.to_json())
        except (BotoCoreError, ClientError) as exc:
            raise QuarantineUnavailableError(f"SQS SendMessage failed: {exc}") from exc
        return delivery.id

    def _receive(self, limit: int, visibility_s: int) -> list[Kept]:
        out: list[Kept] = []
        seen: set[str] = set()
        while len(out) < limit:
            answer = self.client.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(10, limit - len(out)),
                VisibilityTimeout=visibility_s,
                WaitTimeSeconds=0,
            )
            messages = [m for m in answer.get("Messages") or [] if m.get("MessageId") not in seen]
            if not messages:
                break  # empty, or only messages this call already took (visibility ran out)
            for message in messages:
                seen.add(str(message.get("MessageId")))
                try:
                    delivery = Delivery.from_json(message["Body"])
                except ValueError:
                    continue  # not ours: left in the queue for an operator
                out.append(Kept(delivery, message["ReceiptHandle"]))
        return out

    def take(self, limit: int = 10) -> list[Kept]:
        return self._receive(limit, self.visibility_timeout_s)

    def remove(self, kept: Kept) -> None:
        self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=kept.handle)

    def skip(self, kept: Kept) -> None:
        self.client.change_message_visibility(
            QueueUrl=self.queue_url, ReceiptHandle=kept.handle, VisibilityTimeout=SKIP_VISIBILITY_S
        )

    def entries(self, limit: int = 1000) -> list[Delivery]:
        """What the queue shows now (visibility 0: nothing is hidden from a replay)."""
        return sorted(
            (k.delivery for k in self._receive(limit, 0)), key=lambda d: (d.received_ns, d.id)
        )


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
            conn.execute("UPDATE quarantine SET tried_ns = ? WHERE id = ?", (_mark(), row_id))

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


def quarantine_from_settings(queue_url: str | None) -> Quarantine:
    """The quarantine the Lambda uses: the SQS queue when configured, else the log."""
    if queue_url:
        return SqsQuarantine(queue_url)
    return LogQuarantine()
