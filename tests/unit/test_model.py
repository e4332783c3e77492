"""The domain types (opstate.domain.model): immutable, slotted, with the defaults the stores
rely on."""

from __future__ import annotations

import dataclasses

import pytest

from opstate.domain.model import Decision, OpEvent, OpRecord, Reason
from opstate.domain.reducer import apply_event
from opstate.domain.states import State

T = 1_778_400_000_000_000_000


def record(**changes: object) -> OpRecord:
    base = OpRecord("batches/m", State.RUNNING, T, 1, "poll")
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_record_without_times_or_details_has_zero_times_and_empty_details() -> None:
    """Records written before creation/applied times existed read back with 0 (e.g. the
    notifier's idempotency key then keeps ``<name>#<version>``)."""
    plain = OpRecord("batches/m", State.RUNNING, T, 1, "poll")
    assert (plain.created_ns, plain.applied_ns, dict(plain.details)) == (0, 0, {})


@pytest.mark.parametrize(
    "value",
    [
        OpRecord("batches/m", State.RUNNING, T, 1, "poll"),
        OpEvent("batches/m", State.RUNNING, T, "poll"),
        Decision(True, Reason.CREATED, OpEvent("batches/m", State.RUNNING, T, "poll"), None, None),
    ],
)
def test_domain_values_are_immutable_and_slotted(value: object) -> None:
    field = dataclasses.fields(value)[0].name  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, "changed")
    assert not hasattr(value, "__dict__")


def test_state_changed_is_true_for_a_creation_and_an_advance_only() -> None:
    created = apply_event(None, OpEvent("batches/m", State.PENDING, T, "poll"), now_ns=T)
    assert created.applied and created.previous is None and created.state_changed
    current = created.record
    assert current is not None
    advanced = apply_event(current, OpEvent("batches/m", State.RUNNING, T + 1, "poll"))
    assert advanced.state_changed
    refreshed = apply_event(current, OpEvent("batches/m", State.PENDING, T + 2, "poll"))
    assert refreshed.applied and not refreshed.state_changed
    stale = apply_event(current, OpEvent("batches/m", State.PENDING, T - 1, "poll"))
    assert not stale.applied and not stale.state_changed
