"""apply_event: the one pure decision that can only move an operation forward."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from opstate.domain.events import Source, from_batch_job, from_interaction, from_webhook
from opstate.domain.model import APPLIED_REASONS, Decision, OpEvent, OpRecord, Reason
from opstate.domain.names import Kind
from opstate.domain.reducer import OBSERVATION_SCOPED_KEYS, STATE_SCOPED_KEYS, apply_event
from opstate.domain.states import State
from opstate.domain.times import parse_time

NAME = "batches/b1"
P, R, A = State.PENDING, State.RUNNING, State.REQUIRES_ACTION
S, F, C = State.SUCCEEDED, State.FAILED, State.CANCELLED


def ev(
    state: State, t: int, details: dict[str, Any] | None = None, source: str = "poll"
) -> OpEvent:
    return OpEvent(NAME, state, t, source, details or {})


def rec(state: State, t: int, version: int = 3, details: dict[str, Any] | None = None) -> OpRecord:
    return OpRecord(NAME, state, t, version, "poll", details or {}, created_ns=11, applied_ns=22)


def test_reasons_are_exactly_the_architecture_list() -> None:
    assert {r.value for r in Reason} == {
        "created",
        "advanced",
        "refreshed",
        "regress-from-terminal",
        "terminal-conflict",
        "lower-rank",
        "stale-or-equal-update-time",
        "store-rejected",  # set by ingest after the reducer, never by apply_event
    }
    assert {r.value for r in APPLIED_REASONS} == {"created", "advanced", "refreshed"}


@pytest.mark.parametrize("state", list(State))
def test_first_event_creates_version_one(state: State) -> None:
    event = ev(state, 100, {"k": "v"}, source="webhook")
    d = apply_event(None, event, now_ns=555)
    assert d.applied and d.reason is Reason.CREATED
    assert d.previous is None and d.event is event
    assert d.record == OpRecord(NAME, state, 100, 1, "webhook", {"k": "v"}, 555, 555)
    assert d.state_changed
    # What a write took (attempts, lost races) is ingest's to report, never the verdict's.
    assert not hasattr(d, "attempts") and not hasattr(d, "conflicts")


def test_created_with_unknown_time_zero() -> None:
    d = apply_event(None, ev(R, 0))
    assert d.reason is Reason.CREATED and d.record is not None
    assert d.record.update_time_ns == 0 and d.record.created_ns == 0


# (current state, current time) x (event state, event time) -> reason
TABLE: list[tuple[State, int, State, int, Reason]] = [
    # advanced: a higher rank, whatever the time (even an unknown time 0)
    (P, 100, R, 200, Reason.ADVANCED),
    (P, 100, R, 50, Reason.ADVANCED),
    (P, 100, A, 0, Reason.ADVANCED),
    (P, 100, S, 200, Reason.ADVANCED),
    (P, 100, F, 1, Reason.ADVANCED),
    (R, 100, S, 200, Reason.ADVANCED),
    (R, 100, C, 50, Reason.ADVANCED),
    (A, 100, F, 0, Reason.ADVANCED),
    # advanced: same rank, different state, strictly newer
    (R, 100, A, 101, Reason.ADVANCED),
    (A, 100, R, 101, Reason.ADVANCED),
    # refreshed: same state, strictly newer
    (P, 100, P, 101, Reason.REFRESHED),
    (R, 100, R, 200, Reason.REFRESHED),
    (A, 100, A, 200, Reason.REFRESHED),
    (S, 100, S, 200, Reason.REFRESHED),
    (F, 0, F, 1, Reason.REFRESHED),
    (C, 100, C, 101, Reason.REFRESHED),
    # stale-or-equal-update-time: same rank, time not newer
    (P, 100, P, 100, Reason.STALE_OR_EQUAL_UPDATE_TIME),
    (P, 100, P, 99, Reason.STALE_OR_EQUAL_UPDATE_TIME),
    (R, 100, R, 100, Reason.STALE_OR_EQUAL_UPDATE_TIME),
    (R, 100, A, 100, Reason.STALE_OR_EQUAL_UPDATE_TIME),
    (A, 100, R, 50, Reason.STALE_OR_EQUAL_UPDATE_TIME),
    (R, 100, R, 0, Reason.STALE_OR_EQUAL_UPDATE_TIME),
    (S, 100, S, 100, Reason.STALE_OR_EQUAL_UPDATE_TIME),
    (S, 100, S, 0, Reason.STALE_OR_EQUAL_UPDATE_TIME),
    (C, 100, C, 50, Reason.STALE_OR_EQUAL_UPDATE_TIME),
    # lower-rank: a non-terminal current and an event of lower rank, even newer
    (R, 100, P, 200, Reason.LOWER_RANK),
    (A, 100, P, 200, Reason.LOWER_RANK),
    (R, 100, P, 50, Reason.LOWER_RANK),
    # regress-from-terminal: terminal current, non-terminal event, whatever the time
    (S, 100, R, 50, Reason.REGRESS_FROM_TERMINAL),
    (S, 100, R, 200, Reason.REGRESS_FROM_TERMINAL),
    (F, 100, P, 200, Reason.REGRESS_FROM_TERMINAL),
    (C, 100, A, 200, Reason.REGRESS_FROM_TERMINAL),
    (S, 0, P, 1, Reason.REGRESS_FROM_TERMINAL),
    # terminal-conflict: terminal current, a different terminal event, whatever the time
    (S, 100, F, 200, Reason.TERMINAL_CONFLICT),
    (S, 100, F, 50, Reason.TERMINAL_CONFLICT),
    (S, 100, C, 100, Reason.TERMINAL_CONFLICT),
    (F, 100, S, 200, Reason.TERMINAL_CONFLICT),
    (F, 100, C, 200, Reason.TERMINAL_CONFLICT),
    (C, 100, S, 200, Reason.TERMINAL_CONFLICT),
    (C, 100, F, 0, Reason.TERMINAL_CONFLICT),
]


@pytest.mark.parametrize(("cur_state", "cur_t", "ev_state", "ev_t", "reason"), TABLE)
def test_decision_table(
    cur_state: State, cur_t: int, ev_state: State, ev_t: int, reason: Reason
) -> None:
    current = rec(cur_state, cur_t, version=3, details={"old": 1, "shared": "old"})
    event = ev(ev_state, ev_t, {"new": 2, "shared": "new"}, source="webhook")
    d = apply_event(current, event, now_ns=999)
    assert d.reason is reason
    assert d.applied is (reason in APPLIED_REASONS)
    assert d.event is event
    assert d.previous is current
    if d.applied:
        assert d.record == OpRecord(
            NAME,
            ev_state,
            ev_t,
            4,
            "webhook",
            {"old": 1, "shared": "new", "new": 2},
            created_ns=11,
            applied_ns=999,
        )
        assert d.state_changed is (reason is Reason.ADVANCED)
        assert d.record.order_key > current.order_key
    else:
        assert d.record is current
        assert not d.state_changed


def test_every_reason_appears_in_the_table() -> None:
    assert {row[-1] for row in TABLE} | {Reason.CREATED, Reason.STORE_REJECTED} == set(Reason)


def test_seed_stale_running_after_succeeded_is_dropped() -> None:
    done = from_webhook(
        {"type": "batch.succeeded", "timestamp": "2026-01-01T00:00:05Z", "data": {"id": "b1"}}
    )
    stale = from_batch_job(
        {"name": "batches/b1", "state": "JOB_STATE_RUNNING", "updateTime": "2026-01-01T00:00:01Z"}
    )
    first = apply_event(None, done)
    assert first.reason is Reason.CREATED
    second = apply_event(first.record, stale)
    assert not second.applied
    assert second.reason is Reason.REGRESS_FROM_TERMINAL
    assert second.record is first.record
    assert second.record is not None and second.record.state is S
    assert second.record.version == 1


def test_seed_newer_failed_after_succeeded_is_a_terminal_conflict() -> None:
    done = from_webhook(
        {"type": "batch.succeeded", "timestamp": "2026-01-01T00:00:05Z", "data": {"id": "b1"}}
    )
    later_failure = from_webhook(
        {
            "type": "batch.failed",
            "timestamp": "2026-01-01T00:00:09Z",
            "data": {"id": "b1", "error_code": 13},
        }
    )
    first = apply_event(None, done)
    second = apply_event(first.record, later_failure)
    assert not second.applied
    assert second.reason is Reason.TERMINAL_CONFLICT
    assert second.record is not None
    assert second.record.state is S
    assert second.record.details == {}
    assert second.record.version == 1


def test_seed_fraction_and_offset_times_order_correctly() -> None:
    # Same state: ".5Z" is newer than the whole second, so it refreshes; "+09:00" is the same
    # instant as "Z", so it is stale-or-equal.
    whole = ev(R, parse_time("2026-01-01T00:00:00Z"))
    half = ev(R, parse_time("2026-01-01T00:00:00.5Z"))
    same = ev(R, parse_time("2026-01-01T09:00:00+09:00"))
    d1 = apply_event(None, whole)
    d2 = apply_event(d1.record, half)
    assert d2.reason is Reason.REFRESHED
    d3 = apply_event(d1.record, same)
    assert d3.reason is Reason.STALE_OR_EQUAL_UPDATE_TIME
    d4 = apply_event(d2.record, whole)
    assert d4.reason is Reason.STALE_OR_EQUAL_UPDATE_TIME


def test_version_counts_applied_decisions_only() -> None:
    events = [
        (ev(P, 10), Reason.CREATED),
        (ev(P, 10), Reason.STALE_OR_EQUAL_UPDATE_TIME),
        (ev(R, 20, {"progress": 1}), Reason.ADVANCED),
        (ev(P, 30), Reason.LOWER_RANK),
        (ev(R, 25, {"progress": 2}), Reason.REFRESHED),
        (ev(A, 26), Reason.ADVANCED),
        (ev(R, 15), Reason.STALE_OR_EQUAL_UPDATE_TIME),
        (ev(S, 40, {"output_file_uri": "files/o"}), Reason.ADVANCED),
        (ev(R, 50), Reason.REGRESS_FROM_TERMINAL),
        (ev(F, 60), Reason.TERMINAL_CONFLICT),
        (ev(S, 70, {"extra": True}), Reason.REFRESHED),
    ]
    current: OpRecord | None = None
    applied = 0
    for now, (event, reason) in enumerate(events, start=1000):
        d = apply_event(current, event, now_ns=now)
        assert d.reason is reason, event
        applied += d.applied
        assert d.record is not None
        assert d.record.version == applied
        current = d.record
    assert current is not None
    assert current.state is S and current.update_time_ns == 70
    assert current.created_ns == 1000
    assert current.applied_ns == 1000 + len(events) - 1
    assert current.details == {"progress": 2, "output_file_uri": "files/o", "extra": True}


def test_details_merge_on_refresh_and_advance_newer_wins() -> None:
    d1 = apply_event(None, ev(R, 1, {"a": 1, "b": 1}))
    d2 = apply_event(d1.record, ev(R, 2, {"b": 2, "c": 2}))
    assert d2.reason is Reason.REFRESHED and d2.record is not None
    assert d2.record.details == {"a": 1, "b": 2, "c": 2}
    assert not d2.state_changed
    d3 = apply_event(d2.record, ev(S, 3, {"c": 3}))
    assert d3.reason is Reason.ADVANCED and d3.record is not None
    assert d3.record.details == {"a": 1, "b": 2, "c": 3}
    assert d3.state_changed


def test_a_resumed_batch_is_no_longer_paused() -> None:
    paused = from_batch_job(
        {"name": NAME, "state": "JOB_STATE_PAUSED", "updateTime": "2026-01-01T00:00:01Z"}
    )
    resumed = from_batch_job(
        {"name": NAME, "state": "JOB_STATE_RUNNING", "updateTime": "2026-01-01T00:00:02Z"}
    )
    d1 = apply_event(None, paused)
    d2 = apply_event(d1.record, resumed)
    assert d2.reason is Reason.REFRESHED and d2.record is not None
    assert d2.record.details["paused"] is False


def test_inputs_are_not_mutated() -> None:
    current = rec(R, 1, details={"a": 1})
    event = ev(R, 2, {"b": 2})
    before = (dataclasses.replace(current), dict(current.details), dict(event.details))
    d = apply_event(current, event)
    assert d.record is not None and d.record.details == {"a": 1, "b": 2}
    assert (current, dict(current.details), dict(event.details)) == before
    created = apply_event(None, event)
    assert created.record is not None and created.record.details is not event.details


def test_now_never_takes_part_in_the_decision() -> None:
    current = rec(R, 100)
    for event in (ev(R, 100), ev(R, 101), ev(P, 500), ev(S, 1)):
        verdicts = {apply_event(current, event, now_ns=n).reason for n in (0, 50, 100, 10**18)}
        assert len(verdicts) == 1


def test_an_event_for_another_operation_is_a_programming_error() -> None:
    other = OpEvent("batches/other", S, 1, Source.POLL, {})
    with pytest.raises(ValueError, match="batches/other"):
        apply_event(rec(R, 0), other)


def test_record_properties() -> None:
    r = rec(A, 77)
    assert r.kind is Kind.BATCH
    assert r.rank == 1 and not r.terminal
    assert r.order_key == (1, 77)
    assert rec(C, 5).terminal and rec(C, 5).order_key == (2, 5)
    assert OpRecord("models/veo-3/operations/x", P, 0, 1, "report").kind is Kind.VIDEO
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.version = 9  # type: ignore[misc]


def test_decision_state_changed() -> None:
    event = ev(S, 1)
    assert Decision(True, Reason.CREATED, event, rec(S, 1), None).state_changed
    assert Decision(True, Reason.ADVANCED, event, rec(S, 1), rec(R, 0)).state_changed
    assert not Decision(True, Reason.REFRESHED, event, rec(S, 2), rec(S, 1)).state_changed
    assert not Decision(False, Reason.LOWER_RANK, event, rec(R, 1), rec(R, 1)).state_changed
    assert not Decision(False, Reason.LOWER_RANK, event, None, None).state_changed


def test_seed_stories_through_ingest_and_a_store() -> None:
    from opstate.ingest import ingest
    from opstate.store import MemoryStore

    store = MemoryStore()
    done = from_webhook(
        {"type": "batch.succeeded", "timestamp": "2026-01-01T00:00:05Z", "data": {"id": "b1"}}
    )
    assert ingest(store, done).reason is Reason.CREATED
    stale = from_batch_job(
        {"name": "batches/b1", "state": "JOB_STATE_RUNNING", "updateTime": "2026-01-01T00:00:01Z"}
    )
    decision = ingest(store, stale)
    assert not decision.applied
    assert decision.reason is Reason.REGRESS_FROM_TERMINAL
    newer_failure = from_webhook(
        {"type": "batch.failed", "timestamp": "2026-01-01T00:00:09Z", "data": {"id": "b1"}}
    )
    assert ingest(store, newer_failure).reason is Reason.TERMINAL_CONFLICT
    record = store.get("batches/b1")
    assert record is not None
    assert (record.state, record.version) == (S, 1)
    assert record.update_time_ns == parse_time("2026-01-01T00:00:05Z")


def _fold(events: list[OpEvent]) -> OpRecord:
    current: OpRecord | None = None
    for event in events:
        decision = apply_event(current, event)
        assert decision.applied, decision.reason
        current = decision.record
    assert current is not None
    return current


def test_an_interaction_that_needed_continuing_ends_without_the_reason() -> None:
    def status(text: str, second: int) -> OpEvent:
        return from_interaction(
            {"id": "i1", "status": text, "updated": f"2026-01-01T00:00:0{second}Z"}
        )

    final = _fold(
        [status("requires_continuation", 1), status("in_progress", 2), status("completed", 3)]
    )
    assert final.state is S
    assert "reason" not in final.details


def test_a_cancelling_batch_that_succeeds_is_not_cancelling() -> None:
    def job(state: str, second: int, **extra: object) -> OpEvent:
        return from_batch_job(
            {"name": NAME, "state": state, "updateTime": f"2026-01-01T00:00:0{second}Z", **extra}
        )

    final = _fold(
        [job("JOB_STATE_CANCELLING", 1, displayName="mine"), job("JOB_STATE_SUCCEEDED", 2)]
    )
    assert final.state is S
    assert final.details == {"display_name": "mine"}  # persists; cancelling/paused do not


def test_not_found_is_cleared_once_the_operation_is_seen_again() -> None:
    marked = _fold([ev(R, 1, {"user_metadata": {"k": 1}}), ev(R, 2, {"not_found": {"count": 1}})])
    assert marked.details["not_found"] == {"count": 1}
    seen = apply_event(marked, ev(R, 3, {"progress": 1}))
    assert seen.record is not None
    assert seen.record.details == {"user_metadata": {"k": 1}, "progress": 1}


def test_scoped_keys_are_the_documented_ones() -> None:
    assert {
        "reason",
        "cancelling",
        "paused",
        "partial",
        "error_code",
        "error_message",
    } == STATE_SCOPED_KEYS
    assert {"not_found"} == OBSERVATION_SCOPED_KEYS


def test_the_reducer_normalises_what_no_store_can_hold_and_says_so() -> None:
    d = apply_event(None, ev(S, 1, {"user_metadata": {"n": 1e300, "": 2}, "ok": 1}))
    assert d.applied and d.record is not None
    assert d.record.details == {"user_metadata": {"n": "1e+300"}, "ok": 1}
    assert d.details_problems == (
        "$.user_metadata.n: magnitude outside 1e-130 .. 9.99e125",
        "$.user_metadata.: empty key",
    )
    big = apply_event(d.record, ev(S, 2, {"blob": "x" * 70_000}))
    assert big.record is not None and "blob" not in big.record.details
    assert big.details_problems == ("$.blob: dropped: details over the size cap",)
