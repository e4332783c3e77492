"""When each open operation is next polled, and when it counts as lost or overdue. Pure.

``Schedule.interval_s(record, now_ns)``: how long after this poll the operation is due again.

- Younger than ``fast_for_s`` (15 min): 0, i.e. the next run polls it again.
- Then ``age * backoff_ratio`` (1/8 of its age: 7.5 min at 1 h), capped at ``max_interval_s``
  (30 min) for the kinds Gemini pushes (batches, Veo videos, interactions) and at
  ``polled_only_max_interval_s`` (10 min) for kinds it never pushes (file-search imports and
  other LROs), which polling alone finishes.
- An interaction in REQUIRES_ACTION (``requires_action``, and ``idle``, which seems to mean
  "turn finished, waiting for input") waits for a person: straight to ``max_interval_s``.

The age is measured from the record's creation (its server time if unknown).

``run_every_s``: how often the reconciler runs (0: not known). A due time no later than a
run period from now is "the next run" as much as a due time of now is: the reconciler's
``PollWriter`` does not write it (an operation due at the next run either way).

``Schedule.after_poll`` turns one poll outcome into the next ``PollState`` plus the marks to
announce: ``lost`` once an operation was not found in at least ``lost_after_misses`` polls
spanning at least ``lost_after_s``; ``overdue`` once it has been open longer than its kind's
threshold (``overdue_after_s``; batch 24 h by default, the batch API's own target).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from opstate.config import DEFAULT_OVERDUE_HOURS, ReconcileSettings, parse_overdue
from opstate.domain.model import OpRecord
from opstate.domain.names import Kind
from opstate.domain.states import State
from opstate.store.port import PollState

NS = 1_000_000_000
# Kinds Gemini never announces by webhook: only polling finishes them.
POLLED_ONLY_KINDS = frozenset({Kind.FILE_SEARCH_IMPORT, Kind.OPERATION})


class Mark(StrEnum):
    LOST = "lost"
    OVERDUE = "overdue"


def _default_overdue() -> Mapping[Kind, float]:
    return parse_overdue(DEFAULT_OVERDUE_HOURS)


# The defaults of the settable parts are ReconcileSettings' (written once, in config).
_DEFAULTS = ReconcileSettings()


@dataclass(frozen=True, slots=True)
class Schedule:
    fast_for_s: float = 15 * 60.0
    backoff_ratio: float = 0.125
    max_interval_s: float = _DEFAULTS.reconcile_max_interval_s
    polled_only_max_interval_s: float = _DEFAULTS.reconcile_polled_only_max_interval_s
    lost_after_misses: int = _DEFAULTS.reconcile_lost_after_runs
    lost_after_s: float = _DEFAULTS.reconcile_lost_after_s
    overdue_after_s: Mapping[Kind, float] = field(default_factory=_default_overdue)
    run_every_s: float = 0.0

    def age_s(self, record: OpRecord, now_ns: int) -> float:
        start = record.created_ns or record.update_time_ns
        if start <= 0:
            return 0.0
        return max(0.0, (now_ns - start) / NS)

    def interval_s(self, record: OpRecord, now_ns: int) -> float:
        if record.kind is Kind.INTERACTION and record.state is State.REQUIRES_ACTION:
            return self.max_interval_s
        age = self.age_s(record, now_ns)
        if age < self.fast_for_s:
            return 0.0
        cap = (
            self.polled_only_max_interval_s
            if record.kind in POLLED_ONLY_KINDS
            else self.max_interval_s
        )
        return min(cap, age * self.backoff_ratio)

    def next_due_ns(self, record: OpRecord, now_ns: int) -> int:
        return now_ns + int(self.interval_s(record, now_ns) * NS)

    def overdue(self, record: OpRecord, now_ns: int) -> bool:
        threshold = self.overdue_after_s.get(record.kind)
        return threshold is not None and threshold > 0 and self.age_s(record, now_ns) > threshold

    def after_poll(
        self, record: OpRecord, poll: PollState, *, found: bool, now_ns: int
    ) -> tuple[PollState, list[Mark]]:
        """The poll state after polling ``record`` (still open) at ``now_ns``, and the marks
        newly reached, in the order they must be written (overdue before lost)."""
        marks: list[Mark] = []
        if found:
            nxt = replace(poll, misses=0, missing_since_ns=0, lost_ns=0)
        else:
            nxt = replace(
                poll,
                misses=poll.misses + 1,
                missing_since_ns=poll.missing_since_ns or now_ns,
            )
        nxt = replace(nxt, due_ns=self.next_due_ns(record, now_ns))
        if not nxt.overdue_ns and self.overdue(record, now_ns):
            nxt = replace(nxt, overdue_ns=now_ns)
            marks.append(Mark.OVERDUE)
        if (
            not found
            and not nxt.lost
            and nxt.misses >= self.lost_after_misses
            and now_ns - nxt.missing_since_ns >= int(self.lost_after_s * NS)
        ):
            nxt = replace(nxt, lost_ns=now_ns)
            marks.append(Mark.LOST)
        return nxt, marks
