"""The canonical states, their ranks, terminality and parsing."""

from __future__ import annotations

import pytest

from opstate.states import RANK, TERMINAL, State, UnknownStateError, is_terminal, parse_state, rank

TABLE = [
    (State.PENDING, 0, False),
    (State.RUNNING, 1, False),
    (State.REQUIRES_ACTION, 1, False),
    (State.SUCCEEDED, 2, True),
    (State.FAILED, 2, True),
    (State.CANCELLED, 2, True),
]


@pytest.mark.parametrize(("state", "expected_rank", "terminal"), TABLE)
def test_rank_and_terminality(state: State, expected_rank: int, terminal: bool) -> None:
    assert rank(state) == expected_rank
    assert RANK[state] == expected_rank
    assert is_terminal(state) is terminal
    assert (state in TERMINAL) is terminal


def test_the_table_covers_exactly_the_canonical_states() -> None:
    assert {s for s, _, _ in TABLE} == set(State) == set(RANK)
    assert len(State) == 6


def test_terminal_states_share_the_highest_rank() -> None:
    top = max(RANK.values())
    assert {s for s, r in RANK.items() if r == top} == TERMINAL


def test_state_values_are_their_names() -> None:
    for state in State:
        assert state.value == state.name
        assert str(state) == state.name


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("PENDING", State.PENDING),
        ("running", State.RUNNING),
        ("Requires_Action", State.REQUIRES_ACTION),
        (" succeeded ", State.SUCCEEDED),
        ("FAILED", State.FAILED),
        ("cancelled", State.CANCELLED),
        (State.CANCELLED, State.CANCELLED),
    ],
)
def test_parse_state(value: object, expected: State) -> None:
    assert parse_state(value) is expected


@pytest.mark.parametrize(
    "value",
    ["", "DONE", "CANCELED", "JOB_STATE_RUNNING", "REQUIRES ACTION", None, 1, ["RUNNING"]],
)
def test_parse_state_rejects_unknown(value: object) -> None:
    with pytest.raises(UnknownStateError) as info:
        parse_state(value)
    assert info.value.value == value
    assert repr(value) in str(info.value)
    # the message lists what is accepted
    assert "PENDING" in str(info.value) and "CANCELLED" in str(info.value)
    assert isinstance(info.value, ValueError)
