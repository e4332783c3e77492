"""The quarantine: signed webhook deliveries we could not read, kept for a later replay.

A delivery that passed the signature check is Gemini's. If its body cannot be turned into an
event (not JSON Python can read, a known type with a shape the normaliser does not know yet, a
name or time it refuses), refusing it with a 4xx would make Gemini retry for a day and then
disable the endpoint, losing every later event. So the raw delivery is kept here, the webhook
answers 200 (``applied: false``, ``reason: quarantined``), and ``opstate replay`` re-ingests
the kept deliveries once the normaliser learns their shape.

Implementations (all behind ``Quarantine``):
- ``SqsQuarantine``: an SQS queue (production; ``OPSTATE_QUARANTINE_QUEUE_URL``);
- ``SQLiteQuarantine``: a table in a SQLite file (``opstate serve``);
- ``MemoryQuarantine``: tests;
- ``LogQuarantine``: no queue configured: the delivery is logged whole at error level (base64),
  so it is at least recoverable from the logs.

A message is JSON: ``{"v": 1, "id", "webhookId", "receivedAt", "reason", "message",
"body": <base64 of the exact bytes>}``. ``put`` raises ``QuarantineUnavailableError`` (a
``RetryableError``: the webhook answers 503 and Gemini retries) when the delivery could not be
kept; it is never acknowledged otherwise.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from opstate.store.port import RetryableError
from opstate.times import format_time

if TYPE_CHECKING:
    import sqlite3

FORMAT_VERSION = 1


class QuarantineUnavailableError(RetryableError):
    """The delivery could not be kept: the sender must retry."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One signed delivery we could not read: its exact body and why it was not read."""

    id: str
    webhook_id: str | None
    received_ns: int
    reason: str
    message: str
    body: bytes

    @classmethod
    def new(
        cls, body: bytes, *, webhook_id: str | None, reason: str, message: str, received_ns: int
    ) -> Delivery:
        return cls(uuid.uuid4().hex, webhook_id, received_ns, reason, message[:1000], body)

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": FORMAT_VERSION,
                "id": self.id,
                "webhookId": self.webhook_id,
                "receivedAt": format_time(self.received_ns),
                "receivedNs": self.received_ns,
                "reason": self.reason,
                "message": self.message,
                "body": base64.b64encode(self.body).decode("ascii"),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Delivery:
        """A delivery from its message text; ``ValueError`` for anything else."""
        try:
            doc = json.loads(text)
            if not isinstance(doc, Mapping) or doc.get("v") != FORMAT_VERSION:
                raise ValueError("not a quarantined delivery (v1)")
            webhook_id = doc.get("webhookId")
            return cls(
                id=str(doc["id"]),
                webhook_id=webhook_id if isinstance(webhook_id, str) else None,
                received_ns=int(doc.get("receivedNs") or 0),
                reason=str(doc.get("reason", "")),
                message=str(doc.get("message", "")),
                body=base64.b64decode(str(doc["body"]), validate=True),
            )
        except (KeyError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
            raise ValueError(f"not a quarantined delivery: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class Kept:
    """A delivery read back from a quarantine, with the handle that removes it."""

    delivery: Delivery
    handle: str


class Quarantine(Protocol):
    def put(self, delivery: Delivery) -> None:
        """Keep ``delivery``; ``QuarantineUnavailableError`` if it could not be kept."""
        ...

    def take(self, limit: int = 10) -> list[Kept]:
        """Up to ``limit`` kept deliveries (SQS: hidden from other readers for a while)."""
        ...

    def remove(self, kept: Kept) -> None:
        """Forget a delivery that was replayed."""
        ...


class MemoryQuarantine:
    def __init__(self) -> None:
        self._items: dict[str, Delivery] = {}
        self._lock = threading.Lock()

    def put(self, delivery: Delivery) -> None:
        with self._lock:
            self._items[delivery.id] = delivery

    def take(self, limit: int = 10) -> list[Kept]:
        with self._lock:
            items = sorted(self._items.values(), key=lambda d: (d.received_ns, d.id))
        return [Kept(d, d.id) for d in items[:limit]]

    def remove(self, kept: Kept) -> None:
        with self._lock:
            self._items.pop(kept.handle, None)

    def all(self) -> list[Delivery]:
        return [k.delivery for k in self.take(limit=len(self._items) or 1)]


class LogQuarantine:
    """No quarantine configured: the delivery is logged whole (base64 body) at error level."""

    def put(self, delivery: Delivery) -> None:
        from opstate.observability import logger

        logger.error(
            "webhook quarantined to the log (no quarantine queue configured)",
            extra={"quarantined_delivery": delivery.to_json()},
        )

    def take(self, limit: int = 10) -> list[Kept]:
        return []

    def remove(self, kept: Kept) -> None:
        return None


class SqsQuarantine:
    """An SQS queue. ``take`` receives with a visibility timeout: a delivery not removed
    (its replay failed) comes back after it.

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

    def put(self, delivery: Delivery) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.send_message(QueueUrl=self.queue_url, MessageBody=delivery.to_json())
        except (BotoCoreError, ClientError) as exc:
            raise QuarantineUnavailableError(f"SQS SendMessage failed: {exc}") from exc

    def take(self, limit: int = 10) -> list[Kept]:
        out: list[Kept] = []
        seen: set[str] = set()
        while len(out) < limit:
            answer = self.client.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(10, limit - len(out)),
                VisibilityTimeout=self.visibility_timeout_s,
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

    def remove(self, kept: Kept) -> None:
        self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=kept.handle)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS quarantine (
    id          TEXT PRIMARY KEY,
    received_ns TEXT NOT NULL,
    message     TEXT NOT NULL
)
"""


class SQLiteQuarantine:
    """A ``quarantine`` table in a SQLite file (may be the store's own file)."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        with self._connect() as conn:
            conn.execute(_SCHEMA)

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

    def put(self, delivery: Delivery) -> None:
        with self._lock, self._connect() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO quarantine (id, received_ns, message) VALUES (?, ?, ?)",
                (delivery.id, f"{delivery.received_ns:021d}", delivery.to_json()),
            )

    def take(self, limit: int = 10) -> list[Kept]:
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT id, message FROM quarantine ORDER BY received_ns, id LIMIT ?", (limit,)
            ).fetchall()
        out: list[Kept] = []
        for row_id, message in rows:
            with contextlib.suppress(ValueError):
                out.append(Kept(Delivery.from_json(message), str(row_id)))
        return out

    def remove(self, kept: Kept) -> None:
        with self._lock, self._connect() as conn:
            conn.execute("DELETE FROM quarantine WHERE id = ?", (kept.handle,))

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


def local_quarantine(store_url: str) -> SQLiteQuarantine:
    path = local_quarantine_path(store_url)
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteQuarantine(path)


def quarantine_from_settings(queue_url: str | None) -> Quarantine:
    """The quarantine the Lambda uses: the SQS queue when configured, else the log."""
    if queue_url:
        return SqsQuarantine(queue_url)
    return LogQuarantine()
