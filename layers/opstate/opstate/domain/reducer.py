"""The pure reducer: the only place that decides whether an event moves an operation.

``apply_event(current, event)`` reads no clock and does no I/O. It can only move an operation
forward: by rank, then, within a rank, by strictly newer server time. Terminal states are
absorbing and the first terminal state wins. The types it works on (``OpEvent``, ``OpRecord``,
``Decision``, ``Reason``) live in ``opstate.domain.model``.

Details belong to a state. On every applied event the next record's details are:

1. the current details, less ``OBSERVATION_SCOPED_KEYS`` (``not_found``: true only until the
   operation is seen again, so any applied event that does not carry it clears it), less
   ``STATE_SCOPED_KEYS`` when the state changes (``reason``, ``cancelling``, ``paused``,
   ``partial``, ``error_code``, ``error_message``: they describe the state they came with);
2. merged with the event's details, which win (normalised first by ``details.sanitize``: a
   value no store can hold is turned into text or dropped, never the whole event);
3. capped at ``details.MAX_DETAILS_BYTES``: carried-over keys go before the event's own, largest
   first. So no sequence of events can grow an item past the store's limit, and a state change
   always fits, even on a record written before the cap existed.

Every other key persists (``user_metadata``, ``output_file_uri``, ``video_uri``, ``model``,
``display_name``, a producer's own keys). ``Decision.details_problems`` says what was
normalised or dropped, for the caller to log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.domain import details as details_rules
from opstate.domain.details import OBSERVATION_SCOPED_KEYS, STATE_SCOPED_KEYS
from opstate.domain.model import Decision, OpEvent, OpRecord, Reason
from opstate.domain.states import is_terminal, rank

# The detail keys the reducer clears (``details``: a store's one-call write mirrors them).
__all__ = ["OBSERVATION_SCOPED_KEYS", "STATE_SCOPED_KEYS", "apply_event", "next_details"]


def next_details(
    current: Mapping[str, Any] | None, state_changed: bool, event_details: Mapping[str, Any]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The details of the next record (see the module docstring), and the problems found."""
    incoming, problems = details_rules.sanitize(event_details)
    carried: dict[str, Any] = {}
    if current is not None:
        carried = {
            key: value
            for key, value in current.items()
            if key not in OBSERVATION_SCOPED_KEYS
            and not (state_changed and key in STATE_SCOPED_KEYS)
        }
    notes = [str(p) for p in problems]
    if not carried:  # ``sanitize`` already fitted the event's own details to the cap
        return incoming, tuple(notes)
    merged = {**carried, **incoming}
    fitted, dropped = details_rules.fit(merged, keep=incoming)
    notes.extend(f"$.{key[:40]}: dropped: record details over the size cap" for key in dropped)
    return fitted, tuple(notes)


def apply_event(current: OpRecord | None, event: OpEvent, *, now_ns: int = 0) -> Decision:
    """Reduce one event against the current record (None if the operation is new).

    ``now_ns`` is only stamped on the next record as its created/applied time; it never takes
    part in the decision. Reducing an event against another operation's record is a
    programming error (``ValueError``).
    """
    if current is not None and current.name != event.name:
        raise ValueError(f"event for {event.name!r} reduced against the record of {current.name!r}")
    if current is None:
        details, problems = next_details(None, True, event.details)
        record = OpRecord(
            name=event.name,
            state=event.state,
            update_time_ns=event.update_time_ns,
            version=1,
            source=event.source,
            details=details,
            created_ns=now_ns,
            applied_ns=now_ns,
        )
        return Decision(True, Reason.CREATED, event, record, None, details_problems=problems)

    if current.terminal:
        if not is_terminal(event.state):
            return _drop(Reason.REGRESS_FROM_TERMINAL, current, event)
        if event.state != current.state:
            return _drop(Reason.TERMINAL_CONFLICT, current, event)

    event_rank, current_rank = rank(event.state), rank(current.state)
    if event_rank < current_rank:
        return _drop(Reason.LOWER_RANK, current, event)
    if event_rank == current_rank and event.update_time_ns <= current.update_time_ns:
        return _drop(Reason.STALE_OR_EQUAL_UPDATE_TIME, current, event)

    reason = Reason.REFRESHED if event.state == current.state else Reason.ADVANCED
    details, problems = next_details(current.details, reason is Reason.ADVANCED, event.details)
    record = OpRecord(
        name=current.name,
        state=event.state,
        update_time_ns=event.update_time_ns,
        version=current.version + 1,
        source=event.source,
        details=details,
        created_ns=current.created_ns,
        applied_ns=now_ns,
    )
    return Decision(True, reason, event, record, current, details_problems=problems)


def _drop(reason: Reason, current: OpRecord, event: OpEvent) -> Decision:
    return Decision(False, reason, event, current, current)
