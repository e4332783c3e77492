"""What ``opstate serve`` prints for the reconciler's decisions (the ``on_decision`` hook that
replaced the store wrapper guessing the previous record per thread)."""

from __future__ import annotations

from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.reducer import apply_event
from opstate.domain.states import State
from opstate.local.reconcile_loop import decision_line
from opstate.reconcile.run import MarkDecision
from opstate.reconcile.schedule import Mark
from opstate.store import PollState

S = 1_000_000_000
T0 = 1_767_225_600 * S
STAMP = "2026-01-01T00:00:00Z"


def test_state_changes_and_marks_are_printed_refreshes_and_drops_are_not() -> None:
    created = apply_event(None, OpEvent("batches/a", State.PENDING, T0, "poll", {}))
    assert decision_line(created, T0) == f"{STAMP}  batches/a  (new) -> PENDING  v1  (poll)"
    assert created.record is not None
    advanced = apply_event(created.record, OpEvent("batches/a", State.RUNNING, T0 + 1, "poll", {}))
    assert decision_line(advanced, T0) == f"{STAMP}  batches/a  PENDING -> RUNNING  v2  (poll)"
    assert advanced.record is not None
    refreshed = apply_event(
        advanced.record, OpEvent("batches/a", State.RUNNING, T0 + 2, "poll", {})
    )
    assert refreshed.applied and decision_line(refreshed, T0) is None
    stale = apply_event(advanced.record, OpEvent("batches/a", State.RUNNING, T0, "poll", {}))
    assert decision_line(stale, T0) is None
    record = OpRecord("batches/a", State.RUNNING, T0, 2, "poll")
    lost = MarkDecision(Mark.LOST, record, PollState(lost_ns=T0))
    assert decision_line(lost, T0) == f"{STAMP}  batches/a  lost (RUNNING)  v2  (poll)"
