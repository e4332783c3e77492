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

Implementations (all behind ``Quarantine``, ``port``):
- ``SqsQuarantine`` (``sqs``): an SQS queue (production; ``OPSTATE_QUARANTINE_QUEUE_URL``); its
  resource policy lets only the webhook function send; its own limits bound it, and an alarm
  fires on every delivery kept;
- ``SQLiteQuarantine`` (``sqlite``): a table in a SQLite file (``opstate serve``): one entry per
  ``webhook-id`` (Gemini's retries of a delivery are one entry) and bounded
  (``OPSTATE_QUARANTINE_MAX_ENTRIES`` / ``OPSTATE_QUARANTINE_MAX_BYTES`` of bodies); when full,
  ``put`` raises ``QuarantineFullError``: the webhook answers 503, Gemini retries later;
- ``MemoryQuarantine`` (``memory``): tests (same dedupe and bounds);
- ``LogQuarantine`` (``memory``): no queue configured: the delivery is logged whole at error
  level (base64), so it is at least recoverable from the logs.

A replay walks past what it leaves kept (``skip``): the next ``take`` returns the deliveries
tried least recently first (SQLite: a ``tried_ns`` mark; SQS: the message stays hidden for
``SKIP_VISIBILITY_S``), so ``replay --limit N`` run again reaches every delivery.

A message is JSON: ``{"v": 1, "id", "webhookId", "receivedAt", "reason", "message",
"headers": {proof}, "body": <base64 of the exact bytes>}`` (``headers`` is new in this release;
a message without it was kept by an older one and cannot be verified). ``put`` raises
``QuarantineUnavailableError`` (a ``RetryableError``: the webhook answers 503 and Gemini
retries) when the delivery could not be kept; it is never acknowledged otherwise.

Owns: ``port`` (``Delivery``, ``Kept``, the ``Quarantine`` protocol, its errors, ``Bounds``),
``memory``, ``sqs`` and ``sqlite`` (one quarantine each), and ``quarantine_from_settings`` (the
Lambda's choice); this package re-exports the classes, errors and builders its callers import
(the modules' constants stay in their modules). May import the domain (``strict_json``,
``times``), ``config``, ``private_files``, the store's port (``RetryableError``),
``observability`` (the log quarantine, lazily), boto3 (``sqs``, on first use) and sqlite3
(``sqlite``, on first use); never ingest, the API, the reconciler, the local server or the CLI.
"""

from __future__ import annotations

from opstate.quarantine.memory import LogQuarantine, MemoryQuarantine
from opstate.quarantine.port import (
    Bounds,
    Delivery,
    Kept,
    Quarantine,
    QuarantineFullError,
    QuarantineUnavailableError,
)
from opstate.quarantine.sqlite import SQLiteQuarantine, local_quarantine
from opstate.quarantine.sqs import SqsQuarantine

__all__ = [
    "Bounds",
    "Delivery",
    "Kept",
    "LogQuarantine",
    "MemoryQuarantine",
    "Quarantine",
    "QuarantineFullError",
    "QuarantineUnavailableError",
    "SQLiteQuarantine",
    "SqsQuarantine",
    "local_quarantine",
    "quarantine_from_settings",
]


def quarantine_from_settings(queue_url: str | None) -> Quarantine:
    """The quarantine the Lambda uses: the SQS queue when configured, else the log."""
    if queue_url:
        return SqsQuarantine(queue_url)
    return LogQuarantine()
