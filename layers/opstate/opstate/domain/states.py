"""Canonical operation states and their ranks.

A state's rank only ever grows along an operation's life. Terminal states share the highest
rank and are absorbing: once an operation is terminal, nothing moves it again. Adding a source
state is one line in a normaliser's mapping table, never a change here.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    REQUIRES_ACTION = "REQUIRES_ACTION"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


RANK: dict[State, int] = {
    State.PENDING: 0,
    State.RUNNING: 1,
    State.REQUIRES_ACTION: 1,
    State.SUCCEEDED: 2,
    State.FAILED: 2,
    State.CANCELLED: 2,
}

TERMINAL: frozenset[State] = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})


class UnknownStateError(ValueError):
    """A text that is not one of the canonical state names."""

    def __init__(self, value: object) -> None:
        super().__init__(f"unknown state {value!r}; expected one of {', '.join(State)}")
        self.value = value


def rank(state: State) -> int:
    """The rank of a canonical state (0 pending, 1 in progress, 2 terminal)."""
    return RANK[state]


def is_terminal(state: State) -> bool:
    return state in TERMINAL


def parse_state(value: object) -> State:
    """A canonical state from its name, case-insensitively; raises ``UnknownStateError``."""
    if isinstance(value, State):
        return value
    if isinstance(value, str):
        try:
            return State(value.strip().upper())
        except ValueError:
            pass
    raise UnknownStateError(value)
