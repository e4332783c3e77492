"""Re-ingest quarantined webhook deliveries (``opstate replay``).

Each kept delivery passed its signature check when it arrived, so it is not verified again
(its timestamp is long past the tolerance anyway). Its exact bytes go through the same path as
a live webhook: JSON -> ``from_webhook`` -> ``ingest``. Then:

- applied or deliberately dropped (stale, unsupported type, store refusal): removed from the
  quarantine;
- still unreadable (the normaliser does not know the shape yet): kept, counted ``unreadable``;
- a store fault or contention: kept, counted ``errors`` (run the replay again later).

A replayed delivery is one more delivery of an event: the reducer makes replays idempotent
(a duplicate is dropped as stale), so replaying twice is harmless.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opstate.config import DEFAULT_MAX_FUTURE_SKEW_S
from opstate.events import (
    InvalidEventError,
    UnsupportedEventError,
    check_future_skew,
    from_webhook,
)
from opstate.ingest import DEFAULT_MAX_ATTEMPTS, ingest
from opstate.model import Decision
from opstate.quarantine import Kept, Quarantine
from opstate.store.port import RetryableError, Store


@dataclass
class ReplayResult:
    taken: int = 0
    applied: int = 0
    dropped: int = 0
    unreadable: int = 0
    errors: int = 0
    decisions: list[Decision] = field(default_factory=list)
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (id, code, message)

    def to_json(self) -> dict[str, Any]:
        return {
            "taken": self.taken,
            "applied": self.applied,
            "dropped": self.dropped,
            "unreadable": self.unreadable,
            "errors": self.errors,
            "problems": [{"id": i, "error": c, "message": m} for i, c, m in self.problems],
        }


def _reject_constant(value: str) -> Any:
    raise ValueError(f"{value} is not valid JSON")


def replay(
    quarantine: Quarantine,
    store: Store,
    *,
    limit: int = 1000,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    clock_ns: Callable[[], int] = time.time_ns,
    dry_run: bool = False,
) -> ReplayResult:
    """Replay up to ``limit`` kept deliveries (see the module docstring). ``dry_run`` only
    says which ones the normaliser can read now; nothing is ingested or removed."""
    result = ReplayResult()
    for kept in quarantine.take(limit):
        result.taken += 1
        _replay_one(kept, quarantine, store, result, max_attempts, clock_ns, dry_run)
    return result


def _replay_one(
    kept: Kept,
    quarantine: Quarantine,
    store: Store,
    result: ReplayResult,
    max_attempts: int,
    clock_ns: Callable[[], int],
    dry_run: bool,
) -> None:
    delivery = kept.delivery
    try:
        body = json.loads(delivery.body, parse_constant=_reject_constant)
        # Kept for a time too far ahead of our clock: still refused until the clocks agree.
        event = check_future_skew(
            from_webhook(body), now_ns=clock_ns(), max_skew_s=DEFAULT_MAX_FUTURE_SKEW_S
        )
    except UnsupportedEventError:
        result.dropped += 1
        if not dry_run:
            quarantine.remove(kept)
        return
    except InvalidEventError as exc:
        result.unreadable += 1
        result.problems.append((delivery.id, exc.code, exc.message))
        return
    except (ValueError, RecursionError):
        result.unreadable += 1
        result.problems.append((delivery.id, "malformed-json", "the body is not valid JSON"))
        return
    if dry_run:
        result.applied += 1
        return
    try:
        decision = ingest(store, event, max_attempts=max_attempts, clock_ns=clock_ns)
    except RetryableError as exc:
        result.errors += 1
        result.problems.append((delivery.id, "unavailable", str(exc)))
        return
    result.decisions.append(decision)
    if decision.applied:
        result.applied += 1
    else:
        result.dropped += 1
    quarantine.remove(kept)
