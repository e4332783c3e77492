"""What a quarantine is (``Quarantine``) and what it keeps (``Delivery``, read back as ``Kept``):
a signed webhook delivery we could not read, with the headers that proved it was Gemini's, as
the JSON message the package's docstring describes; the errors a quarantine raises; the bounds
of a local one; the "tried at" mark a replay leaves on what it walked past.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from opstate.config import DEFAULT_QUARANTINE_MAX_BYTES, DEFAULT_QUARANTINE_MAX_ENTRIES
from opstate.domain.strict_json import InvalidJSONError, loads
from opstate.domain.times import format_time
from opstate.store.port import RetryableError

FORMAT_VERSION = 1
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


_LAST_MARK = [0]
_MARK_LOCK = threading.Lock()


def tried_mark() -> int:
    """A strictly increasing wall-clock mark (ns) for "tried at"."""
    with _MARK_LOCK:
        _LAST_MARK[0] = max(time.time_ns(), _LAST_MARK[0] + 1)
        return _LAST_MARK[0]
