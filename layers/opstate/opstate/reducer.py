"""The pure reducer: the only place that decides whether an event moves an operation.

``apply_event(current, event)`` reads no clock and does no I/O. It can only move an operation
forward: by rank, then, within a rank, by strictly newer server time. Terminal states are
absorbing and the first terminal state wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from opstate.events import OpEvent
from opstate.names import Kind, kind_of
from opstate.states import State, is_terminal, rank


class Reason(StrEnum):
    # applied
    CREATED = "created"
    ADVANCED = "advanced"
    REFRESHED = "refreshed"
    # dropped
    REGRESS_FROM_TERMINAL = "regress-from-terminal"
    TERMINAL_CONFLICT = "terminal-conflict"
    LOWER_RANK = "lower-rank"
    STALE_OR_EQUAL_UPDATE_TIME = "stale-or-equal-update-time"


APPLIED_REASONS = frozenset({Reason.CREATED, Reason.ADVANCED, Reason.REFRESHED})


@dataclass(frozen=True, slots=True)
class OpRecord:
    """The stored state of one operation. ``version`` counts applied decisions (1 = created)."""

    name: str
    state: State
    update_time_ns: int
    version: int
    source: str
    details: Mapping[str, Any] = field(default_factory=dict)
    created_ns: int = 0
    applied_ns: int = 0

    @property
    def kind(self) -> Kind:
        return kind_of(self.name)

    @property
    def rank(self) -> int:
        return rank(self.state)

    @property
    def terminal(self) -> bool:
        return is_terminal(self.state)

    @property
    def order_key(self) -> tuple[int, int]:
        """What may never go backwards: (rank, server time)."""
        return (rank(self.state), self.update_time_ns)


@dataclass(frozen=True, slots=True)
class Decision:
    """The reducer's verdict on one event.

    ``record`` is the record after the decision: the next record when applied, the current one
    (possibly None) when dropped. ``previous`` is the record the event was reduced against.
    ``attempts`` and ``conflicts`` are filled in by ``ingest`` (lost races before this verdict).
    """

    applied: bool
    reason: Reason
    event: OpEvent
    record: OpRecord | None
    previous: OpRecord | None
    attempts: int = 1
    conflicts: int = 0

    @property
    def state_changed(self) -> bool:
        if not self.applied or self.record is None:
            return False
        return self.previous is None or self.previous.state != self.record.state


def apply_event(current: OpRecord | None, event: OpEvent, *, now_ns: int = 0) -> Decision:
    """Reduce one event against the current record (None if the operation is new).

    ``now_ns`` is only stamped on the next record as its created/applied time; it never takes
    part in the decision. Reducing an event against another operation's record is a
    programming error (``ValueError``).
    """
    if current is not None and current.name != event.name:
        raise ValueError(f"event for {event.name!r} reduced against the record of {current.name!r}")
    if current is None:
        record = OpRecord(
            name=event.name,
            state=event.state,
            update_time_ns=event.update_time_ns,
            version=1,
            source=event.source,
            details=dict(event.details),
            created_ns=now_ns,
            applied_ns=now_ns,
        )
        return Decision(True, Reason.CREATED, event, record, None)

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
    record = OpRecord(
        name=current.name,
        state=event.state,
        update_time_ns=event.update_time_ns,
        version=current.version + 1,
        source=event.source,
        details={**current.details, **event.details},
        created_ns=current.created_ns,
        applied_ns=now_ns,
    )
    return Decision(True, reason, event, record, current)


def _drop(reason: Reason, current: OpRecord, event: OpEvent) -> Decision:
    return Decision(False, reason, event, current, current)
