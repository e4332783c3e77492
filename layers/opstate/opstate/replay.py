"""Re-ingest quarantined webhook deliveries (``opstate replay --quarantine``).

A kept delivery is applied only if it proves again that it is Gemini's: its kept proof headers
are verified over its exact body by ``verifier`` (the configured webhook secrets or the JWT
verifier, without the timestamp tolerance or the token's expiry: a replay is late by design).
One that fails (a message someone else wrote into the queue, a body changed after it was kept,
a delivery an older release kept without its headers, or one signed by a secret no longer
configured) is refused: counted ``refused``, reported, and left where it is for an operator.

Its exact bytes then go through the same path as a live webhook: ``strict_json`` ->
``from_webhook`` -> ``ingest``. Then:

- applied or deliberately dropped (stale, unsupported type, store refusal): removed from the
  quarantine;
- still unreadable (the normaliser does not know the shape yet): kept, counted ``unreadable``;
- a store or secrets fault or contention: kept, counted ``errors`` (run the replay again later).

Whatever stays kept is walked past (``Quarantine.skip``): the next run's ``take`` reaches the
deliveries behind it first, so ``--limit N`` run again reaches every readable delivery.

A replayed delivery is one more delivery of an event: the reducer makes replays idempotent
(a duplicate is dropped as stale), so replaying twice is harmless.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opstate.config import DEFAULT_MAX_FUTURE_SKEW_S
from opstate.domain.events import (
    InvalidEventError,
    UnsupportedEventError,
    check_future_skew,
    from_webhook,
)
from opstate.domain.model import Decision, OpEvent
from opstate.domain.strict_json import InvalidJSONError, loads
from opstate.ingest import DEFAULT_MAX_ATTEMPTS, ingest
from opstate.quarantine import Kept, Quarantine
from opstate.signatures import SignatureError, Verifier
from opstate.store.port import RetryableError, Store

UNSIGNED = "kept without its signature headers (by an older release): it cannot be verified"


@dataclass
class ReplayResult:
    taken: int = 0
    applied: int = 0
    dropped: int = 0
    unreadable: int = 0
    refused: int = 0
    errors: int = 0
    decisions: list[Decision] = field(default_factory=list)
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (id, code, message)

    def to_json(self) -> dict[str, Any]:
        return {
            "taken": self.taken,
            "applied": self.applied,
            "dropped": self.dropped,
            "unreadable": self.unreadable,
            "refused": self.refused,
            "errors": self.errors,
            "problems": [{"id": i, "error": c, "message": m} for i, c, m in self.problems],
        }


def replay(
    quarantine: Quarantine,
    store: Store,
    *,
    verifier: Verifier,
    limit: int = 1000,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    clock_ns: Callable[[], int] = time.time_ns,
    dry_run: bool = False,
) -> ReplayResult:
    """Replay up to ``limit`` kept deliveries (see the module docstring). ``dry_run`` only
    says which ones the normaliser can read now; nothing is ingested, removed or marked."""
    result = ReplayResult()
    for kept in quarantine.take(limit):
        result.taken += 1
        done = _replay_one(kept, store, result, verifier, max_attempts, clock_ns, dry_run)
        if dry_run:
            continue
        if done:
            quarantine.remove(kept)
        else:
            quarantine.skip(kept)
    return result


def _problem(result: ReplayResult, kept: Kept, code: str, message: str) -> bool:
    result.problems.append((kept.delivery.id, code, message))
    return False


def _verified(kept: Kept, result: ReplayResult, verifier: Verifier) -> bool:
    """Whether the kept delivery proves again that it is Gemini's (else counted, reported)."""
    delivery = kept.delivery
    if not delivery.proof:
        result.refused += 1
        return _problem(result, kept, "unverified", UNSIGNED)
    try:
        verifier.verify(delivery.body, delivery.headers)
    except SignatureError:
        result.refused += 1
        return _problem(
            result,
            kept,
            "invalid-signature",
            "its signature does not verify with the configured webhook secrets: not applied",
        )
    except RetryableError as exc:
        result.errors += 1
        return _problem(result, kept, "unavailable", str(exc))
    return True


def _event(kept: Kept, result: ReplayResult, clock_ns: Callable[[], int]) -> OpEvent | bool:
    """The delivery's event; else True (dropped for good) or False (unreadable, kept). One
    kept for a time too far ahead of our clock stays kept (``invalid-time``) until the clocks
    agree."""
    try:
        return check_future_skew(
            from_webhook(loads(kept.delivery.body)),
            now_ns=clock_ns(),
            max_skew_s=DEFAULT_MAX_FUTURE_SKEW_S,
        )
    except UnsupportedEventError:
        result.dropped += 1
        return True
    except InvalidJSONError:
        result.unreadable += 1
        return _problem(result, kept, "malformed-json", "the body is not valid JSON")
    except InvalidEventError as exc:
        result.unreadable += 1
        return _problem(result, kept, exc.code, exc.message)


def _replay_one(
    kept: Kept,
    store: Store,
    result: ReplayResult,
    verifier: Verifier,
    max_attempts: int,
    clock_ns: Callable[[], int],
    dry_run: bool,
) -> bool:
    """Handle one kept delivery; True when it is done with (remove it), False to keep it."""
    if not _verified(kept, result, verifier):
        return False
    event = _event(kept, result, clock_ns)
    if not isinstance(event, OpEvent):
        return event
    if dry_run:
        result.applied += 1
        return False
    try:
        decision = ingest(store, event, max_attempts=max_attempts, clock_ns=clock_ns)
    except RetryableError as exc:
        result.errors += 1
        return _problem(result, kept, "unavailable", str(exc))
    result.decisions.append(decision)
    if decision.applied:
        result.applied += 1
    else:
        result.dropped += 1
    return True
