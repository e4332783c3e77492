"""The ingest loop: one read, conditional writes, reduce again on a lost race, bounded backoff."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from opstate.domain.model import OpEvent, OpRecord, Reason
from opstate.domain.states import State
from opstate.ingest import (
    DEFAULT_BASE_DELAY_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_DELAY_S,
    IngestContentionError,
    ingest,
    ingest_counted,
)
from opstate.store import MemoryStore, RetryableError, StoreUnavailableError, WriteOutcome
from opstate.store.port import RecordRejectedError

NAME = "batches/u1"


def ev(state: State, t: int, **details: object) -> OpEvent:
    return OpEvent(NAME, state, t, "webhook", details)


class RivalStore(MemoryStore):
    """Before each of the first ``losses`` writes, a rival writes ``rival(current)`` first."""

    def __init__(self, losses: int, rival: Callable[[OpRecord | None], OpRecord | None]) -> None:
        super().__init__()
        self.losses = losses
        self.rival = rival
        self.reads = 0
        self.writes = 0

    def get(self, name: str) -> OpRecord | None:
        self.reads += 1
        return super().get(name)

    def _interfere(self, name: str) -> None:
        if self.losses > 0:
            self.losses -= 1
            current = super().get(name)
            winner = self.rival(current)
            with self._lock:
                if winner is None:
                    self._records.pop(name, None)
                else:
                    self._records[name] = winner

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        self.writes += 1
        self._interfere(record.name)
        return super().put_if_absent(record)

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        self.writes += 1
        self._interfere(record.name)
        return super().replace_if_version(record, expected_version)


def bump(current: OpRecord | None) -> OpRecord:
    """A rival refresh: same state, one ns newer, version + 1."""
    assert current is not None
    return OpRecord(
        current.name,
        current.state,
        current.update_time_ns + 1,
        current.version + 1,
        "poll",
        {**current.details, "rival": current.version + 1},
    )


def seeded(losses: int, rival: Callable[[OpRecord | None], OpRecord | None] = bump) -> RivalStore:
    store = RivalStore(losses, rival)
    MemoryStore.put_if_absent(store, OpRecord(NAME, State.RUNNING, 100, 1, "poll", {}))
    return store


def test_uncontended_event_is_one_read_and_one_write() -> None:
    store = seeded(0)
    sleeps: list[float] = []
    done = ingest_counted(store, ev(State.SUCCEEDED, 200), sleep=sleeps.append, clock_ns=lambda: 7)
    decision = done.decision
    assert decision.applied and decision.reason is Reason.ADVANCED
    assert (done.attempts, done.conflicts) == (1, 0)
    assert (store.reads, store.writes, sleeps) == (1, 1, [])
    assert decision.record is not None and decision.record.applied_ns == 7


def test_lost_races_are_counted_and_reduced_against_the_winner() -> None:
    store = seeded(3)
    sleeps: list[float] = []
    done = ingest_counted(store, ev(State.RUNNING, 500, mine=True), sleep=sleeps.append)
    decision = done.decision
    assert decision.applied and decision.reason is Reason.REFRESHED
    assert (done.attempts, done.conflicts) == (4, 3)
    assert store.reads == 1  # never re-read: each lost write handed back the winner
    assert store.writes == 4
    assert len(sleeps) == 3
    record = store.get(NAME)
    assert record is not None and record.version == 5  # 1 seed + 3 rival writes + ours
    assert record.details == {"rival": 4, "mine": True}
    assert decision.previous is not None and decision.previous.version == 4


def test_backoff_is_full_jitter_capped_exponential() -> None:
    store = seeded(6)
    sleeps: list[float] = []
    ingest(
        store,
        ev(State.RUNNING, 10_000),
        base_delay_s=0.01,
        max_delay_s=0.05,
        sleep=sleeps.append,
        jitter=lambda: 1.0,
    )
    assert sleeps == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.05, 0.05])
    half: list[float] = []
    ingest(
        seeded(2),
        ev(State.RUNNING, 10_000),
        base_delay_s=0.01,
        sleep=half.append,
        jitter=lambda: 0.5,
    )
    assert half == pytest.approx([0.005, 0.01])


def test_default_backoff_bounds() -> None:
    sleeps: list[float] = []
    with pytest.raises(IngestContentionError):
        ingest(seeded(100), ev(State.RUNNING, 10**6), sleep=sleeps.append, jitter=lambda: 1.0)
    assert len(sleeps) == DEFAULT_MAX_ATTEMPTS - 1
    assert sleeps[0] == pytest.approx(DEFAULT_BASE_DELAY_S)
    assert max(sleeps) <= DEFAULT_MAX_DELAY_S


def test_a_race_can_make_the_event_a_drop() -> None:
    def finish(current: OpRecord | None) -> OpRecord:
        assert current is not None
        return OpRecord(NAME, State.FAILED, 300, current.version + 1, "poll", {})

    store = seeded(1, finish)
    done = ingest_counted(store, ev(State.RUNNING, 250), sleep=lambda _: None)
    decision = done.decision
    assert not decision.applied and decision.reason is Reason.REGRESS_FROM_TERMINAL
    assert (done.attempts, done.conflicts) == (2, 1)
    assert store.writes == 1


def test_dropped_decision_writes_nothing() -> None:
    store = seeded(0)
    done = ingest_counted(store, ev(State.PENDING, 999))
    assert not done.decision.applied and done.decision.reason is Reason.LOWER_RANK
    assert store.writes == 0 and done.attempts == 1


def test_record_deleted_under_us_is_recreated() -> None:
    store = seeded(1, lambda current: None)
    done = ingest_counted(store, ev(State.SUCCEEDED, 400), sleep=lambda _: None)
    assert done.decision.applied and done.decision.reason is Reason.CREATED
    assert done.conflicts == 1
    record = store.get(NAME)
    assert record is not None and record.version == 1 and record.state is State.SUCCEEDED


def test_exhaustion_raises_a_retryable_contention_error() -> None:
    store = seeded(100)
    with pytest.raises(IngestContentionError) as info:
        ingest(store, ev(State.RUNNING, 10**6), max_attempts=3, sleep=lambda _: None)
    assert isinstance(info.value, RetryableError)
    assert (info.value.name, info.value.attempts) == (NAME, 3)
    assert store.writes == 3 and store.reads == 1


def test_store_fault_escapes_as_store_unavailable() -> None:
    class Down(MemoryStore):
        def get(self, name: str) -> OpRecord | None:
            raise StoreUnavailableError("throttled")

    with pytest.raises(StoreUnavailableError):
        ingest(Down(), ev(State.RUNNING, 1))


def test_max_attempts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        ingest(MemoryStore(), ev(State.RUNNING, 1), max_attempts=0)


def test_one_attempt_means_one_write_and_no_sleep() -> None:
    slept: list[float] = []
    won = ingest_counted(seeded(0), ev(State.SUCCEEDED, 400), max_attempts=1, sleep=slept.append)
    assert won.decision.applied and (won.attempts, won.conflicts) == (1, 0)
    store = seeded(1)
    with pytest.raises(IngestContentionError) as info:
        ingest(store, ev(State.SUCCEEDED, 10**6), max_attempts=1, sleep=slept.append)
    assert info.value.attempts == 1 and store.writes == 1
    assert "after 1 conflicting writes" in str(info.value)
    assert slept == []


class RefusingStore(MemoryStore):
    """Refuses (``RecordRejectedError``) every record whose details are not empty, or all."""

    def __init__(self, refuse_all: bool = False) -> None:
        super().__init__()
        self.refuse_all = refuse_all
        self.refused = 0

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        if self.refuse_all or record.details:
            self.refused += 1
            raise RecordRejectedError("ValidationException: item too large")
        return super().put_if_absent(record)


def test_a_store_refusal_still_writes_the_state_without_details() -> None:
    store = RefusingStore()
    decision = ingest(store, ev(State.SUCCEEDED, 5, output_file_uri="files/o"))
    assert decision.applied and decision.reason is Reason.CREATED
    assert decision.details_problems[-1] == "$: dropped: the store refused"
    record = store.get(NAME)
    assert record is not None and record.state is State.SUCCEEDED and record.details == {}
    assert store.refused == 1


def test_a_record_the_store_always_refuses_is_a_permanent_drop_not_an_error() -> None:
    store = RefusingStore(refuse_all=True)
    decision = ingest(store, ev(State.SUCCEEDED, 5, output_file_uri="files/o"))
    assert not decision.applied and decision.reason is Reason.STORE_REJECTED
    assert decision.record is None and store.get(NAME) is None and store.refused == 2
    assert not isinstance(RecordRejectedError("x"), RetryableError)


def test_every_store_refuses_details_no_store_can_hold() -> None:
    store = MemoryStore()
    bad = OpRecord(NAME, State.RUNNING, 1, 1, "poll", {"n": 1e300})
    with pytest.raises(RecordRejectedError, match=r"\$.n: magnitude"):
        store.put_if_absent(bad)
    assert store.get(NAME) is None
