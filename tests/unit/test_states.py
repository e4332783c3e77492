"""The canonical states: ranks and parsing."""

from __future__ import annotations

import pytest

from opstate.domain.states import (
    RANK,
    TERMINAL,
    State,
    UnknownStateError,
    is_terminal,
    parse_state,
    rank,
)


def test_ranks_are_the_architecture_table() -> None:
    assert RANK == {
        State.PENDING: 0,
        State.RUNNING: 1,
        State.REQUIRES_ACTION: 1,
        State.SUCCEEDED: 2,
        State.FAILED: 2,
        State.CANCELLED: 2,
    }
    assert {rank(s) for s in TERMINAL} == {2}
    assert [s for s in State if is_terminal(s)] == [State.SUCCEEDED, State.FAILED, State.CANCELLED]


@pytest.mark.parametrize("text", ["running", " RUNNING", "Running \n", "\trunning\t"])
def test_parse_state_ignores_case_and_surrounding_space(text: str) -> None:
    assert parse_state(text) is State.RUNNING


@pytest.mark.parametrize("value", ["RUN NING", "", 1, None, "JOB_STATE_RUNNING"])
def test_parse_state_refuses_anything_else(value: object) -> None:
    with pytest.raises(UnknownStateError) as info:
        parse_state(value)
    assert str(info.value) == (
        f"unknown state {value!r}; expected one of "
        "PENDING, RUNNING, REQUIRES_ACTION, SUCCEEDED, FAILED, CANCELLED"
    )
