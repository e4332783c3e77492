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

What the decision took is reported beside it, never in it: ``ingest_counted`` returns
``Ingested`` (the decision, its attempts and the conditional writes lost before it), for the
callers that log and count those (the API, the reconciler); ``ingest`` returns the decision only.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

from opstate.config import DEFAULT_INGEST_MAX_ATTEMPTS
from opstate.domain.model import Decision, OpEvent, OpRecord, Reason
from opstate.domain.names import VIDEO_DETAIL, ParsedName, legacy_names
from opstate.domain.reducer import apply_event
from opstate.domain.states import State
from opstate.observability import count, logger
from opstate.store.port import (
    ApplyingStore,
    RecordRejectedError,
    RetryableError,
    Store,
    WriteOutcome,
)

DEFAULT_MAX_ATTEMPTS = DEFAULT_INGEST_MAX_ATTEMPTS
DEFAULT_BASE_DELAY_S = 0.02
DEFAULT_MAX_DELAY_S = 0.5


class Unknown:
    """The caller has no record at hand: ``ingest`` finds it (or writes without it)."""


UNKNOWN = Unknown()


class IngestContentionError(RetryableError):
    """Every attempt lost its conditional write to a concurrent writer."""

    def __init__(self, name: str, attempts: int) -> None:
        super().__init__(f"gave up on {name} after {attempts} conflicting writes")
        self.name = name
        self.attempts = attempts


@dataclass(frozen=True, slots=True)
class Ingested:
    """The decision that took effect and what it took: ``attempts`` reductions, one per
    conditional write tried (1: no race lost); ``conflicts``, the writes lost before it."""

    decision: Decision
    attempts: int = 1

    @property
    def conflicts(self) -> int:
        return self.attempts - 1


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
    known: OpRecord | Unknown | None = UNKNOWN,
) -> Decision:
    """Apply ``event`` to ``store`` monotonically; returns the decision that took effect
    (``ingest_counted`` without the counters)."""
    return ingest_counted(
        store,
        event,
        max_attempts=max_attempts,
        base_delay_s=base_delay_s,
        max_delay_s=max_delay_s,
        clock_ns=clock_ns,
        sleep=sleep,
        jitter=jitter,
        known=known,
    ).decision


def ingest_counted(
    store: Store,
    event: OpEvent,
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    base_delay_s: float = DEFAULT_BASE_DELAY_S,
    max_delay_s: float = DEFAULT_MAX_DELAY_S,
    clock_ns: Callable[[], int] = time.time_ns,
    sleep: Callable[[float], None] = time.sleep,
    jitter: Callable[[], float] = random.random,
    known: OpRecord | Unknown | None = UNKNOWN,
) -> Ingested:
    """Apply ``event`` to ``store`` monotonically; returns the decision that took effect and
    the attempts it took.

    The record to reduce against, then at most ``max_attempts`` conditional writes. A lost
    write hands back the record that beat it, which is reduced again with no second read;
    between attempts the loop sleeps with full jitter (uniform in [0, min(max, base * 2**n)]).

    The record is ``known`` when the caller just read it (None: it read none), else one
    consistent read - except on a store that writes without reading (``ApplyingStore``):
    there a PENDING event (a job being tracked: usually new) is first written as a create, any
    other event as ``apply_if_newer``, and either write that misses hands back the stored
    record, so a new or an advancing event is one call and a miss costs what the read would
    have. A key an earlier release may have used (``legacy_names``) is always looked up.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    start = _start(store, event, known, clock_ns)
    if isinstance(start, Ingested):
        return start
    current, event = start
    for attempt in range(1, max_attempts + 1):
        decision = apply_event(current, event, now_ns=clock_ns())
        if not decision.applied:
            return Ingested(decision, attempt)
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
                rejected = Decision(False, Reason.STORE_REJECTED, event, current, current)
                return Ingested(rejected, attempt)
            _log_rejected(event, str(first), dropped=False)
            decision = replace(
                decision,
                record=record,
                details_problems=(*decision.details_problems, "$: dropped: the store refused"),
            )
        if outcome.ok:
            _log_problems(decision)
            return Ingested(decision, attempt)
        current = outcome.current
        if attempt < max_attempts:
            sleep(jitter() * min(max_delay_s, base_delay_s * (2 ** (attempt - 1))))
    raise IngestContentionError(event.name, max_attempts)


def _start(
    store: Store, event: OpEvent, known: OpRecord | Unknown | None, clock_ns: Callable[[], int]
) -> Ingested | tuple[OpRecord | None, OpEvent]:
    """The record to reduce against first (and the event, renamed to a legacy key), or the
    decision when the one-call write already took the event (``ingest_counted``)."""
    if legacy_names(event.name, event.details):
        # A key an earlier release may have used: look both up, never write blind under the
        # canonical key (the one-call write would create a second record beside the old one).
        return find_current(store, event)
    # An attribute test, not ``isinstance(store, ApplyingStore)``: a runtime Protocol check
    # costs about 0.1 ms, a tenth of a webhook delivery's hot path.
    if isinstance(known, Unknown) and callable(getattr(store, "apply_if_newer", None)):
        if event.state is State.PENDING:
            known = None
        else:
            done = _apply_in_one(cast(ApplyingStore, store), event, clock_ns)
            if isinstance(done, Ingested):
                return done
            known = done
    if isinstance(known, Unknown):
        return find_current(store, event)
    return known, event


def _apply_in_one(
    store: ApplyingStore, event: OpEvent, clock_ns: Callable[[], int]
) -> Ingested | OpRecord | Unknown | None:
    """``store.apply_if_newer``: the decision when it wrote, else the stored record it handed
    back (None: none), or ``UNKNOWN`` when it was not tried or the store refused the write
    (the read-reduce-write then does what it does with a refused record)."""
    now_ns = clock_ns()
    try:
        outcome = store.apply_if_newer(event, now_ns)
    except RecordRejectedError:
        return UNKNOWN
    if outcome is None:
        return UNKNOWN
    if not outcome.ok:
        return outcome.current
    decision = apply_event(outcome.current, event, now_ns=now_ns)
    if not decision.applied:  # the condition is the reducer's rule: this is a store bug
        raise RuntimeError(f"{event.name}: written, but the reducer drops it ({decision.reason})")
    _log_problems(decision)
    return Ingested(decision, 1)


def find_record(
    store: Store, name: str, details: Mapping[str, Any] | None = None, also: Iterable[str] = ()
) -> OpRecord | None:
    """The record of canonical ``name``, or of a key an earlier release stored it under
    (``names.legacy_names``: a video operation keyed by its full name; ``also``, a lookup's
    ``ParsedName.legacy``: a Google Cloud name keyed with its location as written), or None."""
    record = store.get(name)
    if record is not None:
        return record
    for legacy in (*legacy_names(name, details or {}), *also):
        record = store.get(legacy)
        if record is not None:
            return record
    return None


def find_named(store: Store, parsed: ParsedName) -> OpRecord | None:
    """``find_record`` for a name a caller gave (an API path, a command's argument, the
    page's query): the video model it carried names the key an earlier release used, and
    ``parsed.legacy`` the Cloud spelling it kept."""
    details = {VIDEO_DETAIL: parsed.model} if parsed.model else None
    return find_record(store, parsed.key, details, parsed.legacy)


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
