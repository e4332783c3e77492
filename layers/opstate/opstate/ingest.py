"""The one ingest path: read, reduce, conditional write, and on a lost race reduce again.

Every source (webhooks, the reconciler, reports, replays) goes through ``ingest``. An event is
acknowledged only when it was applied or deliberately dropped; otherwise a ``RetryableError``
escapes (``IngestContentionError`` after the bound, ``StoreUnavailableError`` on a store fault),
and the caller must answer "retry later", never "ok".

A store that refuses the record itself (``RecordRejectedError``: a ``ValidationException``, details
no store can hold) is a permanent refusal, never a retry: the write is tried once more with the
record's details emptied (the state change always goes through), and if that is refused too the
event is dropped with reason ``store-rejected``, logged and counted. Details the reducer had to
normalise or drop (``Decision.details_problems``) are logged as a warning and counted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from opstate.events import OpEvent
from opstate.names import legacy_names
from opstate.observability import count, logger
from opstate.reducer import Decision, OpRecord, Reason, apply_event
from opstate.store.port import RecordRejectedError, RetryableError, Store, WriteOutcome

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
    current, event = find_current(store, event)
    for attempt in range(1, max_attempts + 1):
        conflicts = attempt - 1
        decision = apply_event(current, event, now_ns=clock_ns())
        if not decision.applied:
            return replace(decision, attempts=attempt, conflicts=conflicts)
        record = decision.record
        assert record is not None
        try:
            outcome = _write(store, record, current)
        except RecordRejectedError as first:
            try:
                record = replace(record, details={})
                outcome = _write(store, record, current)
            except RecordRejectedError as exc:
                _log_rejected(event, str(exc), dropped=True)
                return Decision(
                    False, Reason.STORE_REJECTED, event, current, current, attempt, conflicts
                )
            _log_rejected(event, str(first), dropped=False)
            decision = replace(
                decision,
                record=record,
                details_problems=(*decision.details_problems, "$: dropped: the store refused"),
            )
        if outcome.ok:
            _log_problems(decision)
            return replace(decision, attempts=attempt, conflicts=conflicts)
        current = outcome.current
        if attempt < max_attempts:
            sleep(jitter() * min(max_delay_s, base_delay_s * (2 ** (attempt - 1))))
    raise IngestContentionError(event.name, max_attempts)


def find_record(
    store: Store, name: str, details: Mapping[str, Any] | None = None
) -> OpRecord | None:
    """The record of canonical ``name``, or of the key an earlier release stored it under
    (``names.legacy_names``: a video operation keyed by its full name), or None."""
    record = store.get(name)
    if record is not None:
        return record
    for legacy in legacy_names(name, details or {}):
        record = store.get(legacy)
        if record is not None:
            return record
    return None


def find_current(store: Store, event: OpEvent) -> tuple[OpRecord | None, OpEvent]:
    """The current record of ``event``'s operation, and the event renamed to that record's key
    when the record was stored under an older key (the record keeps its key for its life)."""
    current = find_record(store, event.name, event.details)
    if current is not None and current.name != event.name:
        event = replace(event, name=current.name)
    return current, event


def _write(store: Store, record: OpRecord, current: OpRecord | None) -> WriteOutcome:
    if current is None:
        return store.put_if_absent(record)
    return store.replace_if_version(record, current.version)


def _log_rejected(event: OpEvent, message: str, *, dropped: bool) -> None:
    logger.error(
        "store refused the record"
        + ("; event dropped" if dropped else "; written without details"),
        extra={"operation": event.name, "state": str(event.state), "error": message[:500]},
    )
    count("StoreRejected")


def _log_problems(decision: Decision) -> None:
    if not decision.details_problems:
        return
    logger.warning(
        "details normalised",
        extra={
            "operation": decision.event.name,
            "source": str(decision.event.source),
            "problems": list(decision.details_problems[:20]),
        },
    )
    count("DetailsNormalised")
