"""Pure parts of the reconciler: the not-found marker, poll order, backoff, result shape."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from opstate.events import OpEvent
from opstate.reconcile import Backoff, PollMemory, RunResult, classify, not_found_event
from opstate.reducer import OpRecord, Reason, apply_event
from opstate.states import State
from opstate.times import parse_time

T = parse_time("2026-05-01T10:00:00Z")


def rec(name: str, state: State = State.RUNNING, t: int = T, **details: object) -> OpRecord:
    return OpRecord(name, state, t, 3, "poll", dict(details), 1, 1)


def test_importing_the_module_does_not_import_google_genai() -> None:
    code = "import sys, opstate.reconcile; print('google.genai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_classify_sdk_failures() -> None:
    import httpx2
    from google.genai import errors
    from google.genai._interactions import APITimeoutError, NotFoundError, RateLimitError

    def status_error(cls: type, status: int) -> BaseException:
        request = httpx2.Request("GET", "http://127.0.0.1/v1/interactions/x")
        return cls("boom", response=httpx2.Response(status, request=request), body=None)

    cases = {
        errors.ClientError(404, {"error": {"message": "nope"}}): (404, False, True),
        errors.ClientError(429, {}): (429, True, False),
        errors.ClientError(403, {}): (403, False, False),
        errors.ServerError(500, {}): (500, True, False),
        errors.ServerError(503, {}): (503, True, False),
        httpx2.ReadTimeout("slow"): (None, True, False),
        httpx2.ConnectError("refused"): (None, True, False),
        status_error(NotFoundError, 404): (404, False, True),
        status_error(RateLimitError, 429): (429, True, False),
        APITimeoutError(request=httpx2.Request("GET", "http://127.0.0.1/")): (None, True, False),
        ValueError("something else"): (None, False, False),
    }
    for exc, (status, transient, not_found) in cases.items():
        failure = classify(exc)
        assert (failure.status, failure.transient, failure.not_found) == (
            status,
            transient,
            not_found,
        ), exc


def test_first_not_found_marker() -> None:
    now = parse_time("2026-05-03T00:00:00Z")
    event = not_found_event(rec("batches/a", keep="yes"), now)
    assert event == OpEvent(
        "batches/a",
        State.RUNNING,
        T + 1,
        "poll",
        {
            "not_found": {
                "first_seen_at": "2026-05-03T00:00:00.000000000Z",
                "last_seen_at": "2026-05-03T00:00:00.000000000Z",
                "count": 1,
            }
        },
    )


def test_later_marker_keeps_first_seen_and_counts() -> None:
    earlier = {"first_seen_at": "2026-05-02T00:00:00.000000000Z", "count": 4}
    event = not_found_event(rec("batches/a", not_found=earlier), parse_time("2026-05-05T00:00:00Z"))
    assert event.details["not_found"] == {
        "first_seen_at": "2026-05-02T00:00:00.000000000Z",
        "last_seen_at": "2026-05-05T00:00:00.000000000Z",
        "count": 5,
    }


def test_garbled_marker_starts_again() -> None:
    event = not_found_event(rec("batches/a", not_found="junk"), T + 10)
    assert event.details["not_found"]["count"] == 1


@settings(max_examples=60, deadline=None)
@given(
    state=st.sampled_from([State.PENDING, State.RUNNING, State.REQUIRES_ACTION]),
    t=st.integers(min_value=0, max_value=2**62),
    markers=st.integers(min_value=1, max_value=5),
)
def test_markers_are_same_state_refreshes_and_never_block_real_progress(
    state: State, t: int, markers: int
) -> None:
    current = rec("batches/a", state, t)
    for i in range(markers):
        decision = apply_event(current, not_found_event(current, T + i))
        assert decision.applied and decision.reason is Reason.REFRESHED
        assert decision.record is not None
        assert decision.record.state is state and decision.record.update_time_ns == t + i + 1
        current = decision.record
    # Any real later observation (a microsecond later, or a higher rank) still applies.
    later = OpEvent("batches/a", state, t + markers + 1000, "poll", {})
    assert apply_event(current, later).applied
    assert apply_event(current, OpEvent("batches/a", State.SUCCEEDED, 0, "webhook", {})).applied


def test_a_marker_built_from_a_stale_snapshot_is_dropped() -> None:
    snapshot = rec("batches/a", State.RUNNING, T)
    newer = rec("batches/a", State.RUNNING, T + 1000)
    assert not apply_event(newer, not_found_event(snapshot, T)).applied
    done = rec("batches/a", State.SUCCEEDED, T)
    assert not apply_event(done, not_found_event(snapshot, T)).applied


def test_poll_memory_orders_unpolled_first_then_least_recently_polled() -> None:
    records = [rec(f"batches/{c}", t=T + i) for i, c in enumerate("abcdef")]
    memory = PollMemory()
    assert memory.order(records) == records  # fresh: the store's order, oldest first
    run1 = memory.begin_run()
    for r in records[:3]:
        memory.mark(r.name, run1)
    assert [r.name[-1] for r in memory.order(records)] == list("defabc")
    run2 = memory.begin_run()
    for r in records[3:5]:
        memory.mark(r.name, run2)
    assert [r.name[-1] for r in memory.order(records)] == list("fabcde")
    # Names that are no longer open are forgotten.
    assert [r.name[-1] for r in memory.order(records[:2])] == list("ab")
    assert [r.name[-1] for r in memory.order(records)] == list("cdefab")


def test_backoff_is_exponential_and_capped() -> None:
    backoff = Backoff(base_s=0.5, max_s=5.0, trip_after=10)
    assert [backoff.delay(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 4.0, 5.0]
    assert backoff.delay(10_000) == 5.0


def test_run_result_dict_has_exactly_the_documented_fields() -> None:
    result = RunResult(1, 2, 3, 4, 5, 6, 7, True)
    assert result.as_dict() == {
        "discovered": 1,
        "polled": 2,
        "applied": 3,
        "dropped": 4,
        "not_found": 5,
        "errors": 6,
        "remaining_open": 7,
        "stopped_early": True,
    }
