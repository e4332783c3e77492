"""The domain's types: an observation (``OpEvent``), the stored state of an operation
(``OpRecord``) and the reducer's verdict (``Decision``, with its ``Reason``).

Pure data: no clock, no I/O, no AWS, HTTP or Gemini code. What builds them lives elsewhere:
the normalisers (``opstate.domain.events``) make events, the reducer
(``opstate.domain.reducer``) makes decisions and the records they carry, the stores keep
records. Every layer above imports these types from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from opstate.domain.names import Kind, kind_of
from opstate.domain.states import State, is_terminal, rank
from opstate.domain.times import check_ns


@dataclass(frozen=True, slots=True)
class OpEvent:
    """One observation of an operation's state at a server time (ns since epoch, 0 = unknown)."""

    name: str
    state: State
    update_time_ns: int
    source: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A time no store can render must never reach one (e.g. a marker 1 ns past year 9999).
        check_ns(self.update_time_ns)

    @property
    def kind(self) -> Kind:
        return kind_of(self.name)


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
    # dropped after the reducer: the store refused the record (set by ``ingest``, never by the
    # reducer)
    STORE_REJECTED = "store-rejected"


APPLIED_REASONS = frozenset({Reason.CREATED, Reason.ADVANCED, Reason.REFRESHED})


@dataclass(frozen=True, slots=True)
class Decision:
    """The reducer's verdict on one event.

    ``record`` is the record after the decision: the next record when applied, the current one
    (possibly None) when dropped. ``previous`` is the record the event was reduced against.
    ``details_problems`` says what of the event's details was normalised or dropped. What it
    took to write (attempts, lost races) is ingest's to report (``opstate.ingest.Ingested``).
    """

    applied: bool
    reason: Reason
    event: OpEvent
    record: OpRecord | None
    previous: OpRecord | None
    details_problems: tuple[str, ...] = ()

    @property
    def state_changed(self) -> bool:
        if not self.applied or self.record is None:
            return False
        return self.previous is None or self.previous.state != self.record.state
