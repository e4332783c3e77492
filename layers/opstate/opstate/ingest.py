"""The one ingest path: read, reduce, conditional write, and on a lost race reduce again.

Every source (webhooks, the reconciler, reports, replays) goes through ``ingest``. An event is
acknowledged only when it was applied or deliberately dropped; otherwise a ``RetryableError``
escapes (``IngestContentionError`` after the bound, ``StoreUnavailableError`` on a store fault),
and the caller must answer "retry later", never "ok".
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace

from opstate.events import OpEvent
from opstate.reducer import Decision, apply_event
from opstate.store.port import RetryableError, Store

DEFAULT_MAX_ATTEMPTS = 8
DEFAULT_BASE_DELAY_S = 0.02
DEFAULT_MAX_DELAY_S = 0.5


class IngestContentionError(RetryableError):
    """Every attempt lost its conditional write to a concurrent writer."""

    def __init__(self, name: str, attempts: int) -> None:
        super().__init__(f"gave up on {name} after {attempts} conflicting writes")
        self.name = name
        self.attempts = attempts


def ingest(
    store: Store,
    event: OpEvent,
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    base_delay_s: float = DEFAULT_BASE_DELAY_S,
    max_delay_s: float = DEFAULT_MAX_DELAY_S,
    clock_ns: Callable[[], int] = time.time_ns,
    sleep: Callable[[float], None] = time.sleep,
    jitter: Callable[[], float] = random.random,
) -> Decision:
    """Apply ``event`` to ``store`` monotonically; returns the decision that took effect.

    One consistent read, then at most ``max_attempts`` conditional writes. A lost write hands
    back the record that beat it, which is reduced again with no second read; between attempts
    the loop sleeps with full jitter (uniform in [0, min(max, base * 2**n)]).
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    current = store.get(event.name)
    for attempt in range(1, max_attempts + 1):
        conflicts = attempt - 1
        decision = apply_event(current, event, now_ns=clock_ns())
        if not decision.applied:
            return replace(decision, attempts=attempt, conflicts=conflicts)
        record = decision.record
        assert record is not None
        if current is None:
            outcome = store.put_if_absent(record)
        else:
            outcome = store.replace_if_version(record, current.version)
        if outcome.ok:
            return replace(decision, attempts=attempt, conflicts=conflicts)
        current = outcome.current
        if attempt < max_attempts:
            sleep(jitter() * min(max_delay_s, base_delay_s * (2 ** (attempt - 1))))
    raise IngestContentionError(event.name, max_attempts)
