"""``when: final`` (issue 33): a waiter on a root batch with retries is resumed once the root's
retry state says its final result is written; without retries it is ``archived``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opstate.domain.costs import REASON_FINAL_PREVIOUS_RELEASE
from opstate.domain.retry import final_view
from opstate.domain.states import TERMINAL, State
from opstate.domain.views import record_to_json
from opstate.store.memory import MemoryStore
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RETRY_MEMBER, RetryState
from opstate.waiters.enabled import ALL_TARGETS
from opstate.waiters.memory import MemoryWaiterStore
from opstate.waiters.model import (
    PENDING,
    Failure,
    Status,
    Success,
    Target,
    Waiter,
    When,
    decide,
    final_of,
    parse_waiter,
)
from opstate.waiters.port import ARCHIVING_UNAVAILABLE
from opstate.waiters.run import (
    ArchivingUnavailableError,
    Registrar,
    Resumer,
    resume_after_final,
    store_status,
    wait_until,
)
from tests.unit.test_waiters import T0, TOKEN, FakeCallbacks, rec

FINAL_URI = "s3://results/r/batches/a/final.jsonl"


def root_doc(final: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "policy": {"maxAttempts": 2, "resubmitExpired": False, "pendingTimeoutHours": None},
        "children": [],
    }
    if final is not None:
        doc["final"] = {
            "status": final,
            "location": FINAL_URI if final == "final" else None,
            "rows": {"total": 10, "answered": 9, "blocked": 1, "failed": 1},
            "errors": {"400": 1},
            "retried": 3,
            "attempts": 2,
        }
    return doc


def state(status: str, final: str | None) -> dict[str, Any]:
    doc = {"lineage": {"root": "batches/r", "attempt": 1}} if status == RETRY_MEMBER else None
    return RetryState(status, T0, 1, T0, doc or root_doc(final)).as_dict()


def test_parse_accepts_final_and_names_it_when_refusing() -> None:
    w = parse_waiter("batches/a", {"stepFunctionsTaskToken": TOKEN, "when": "final"}, now_ns=1)
    assert w.when is When.FINAL
    with pytest.raises(ValueError, match="'terminal', 'archived' or 'final'"):
        parse_waiter("batches/a", {"stepFunctionsTaskToken": TOKEN, "when": "finished"}, now_ns=1)


def test_final_is_refused_where_archiving_is_not_built() -> None:
    registrar = Registrar(MemoryWaiterStore(), limit=2, archiving=False, targets=ALL_TARGETS)
    with pytest.raises(ArchivingUnavailableError, match=ARCHIVING_UNAVAILABLE):
        registrar.register(Waiter("batches/a", Target.STEP_FUNCTIONS, "t", When.FINAL))
    assert registrar.waiters.list("batches/a") == []


states = st.sampled_from(list(State))
archive = st.sampled_from([None, "pending", "archived", "none", "failed", "expired"])
retries = st.one_of(
    st.none(),
    st.tuples(
        st.sampled_from([RETRY_ACTIVE, RETRY_DONE, RETRY_MEMBER]),
        st.sampled_from([None, "pending", "final"]),
    ),
)


@given(state_=states, lost=st.booleans(), archived=archive, retry=retries)
def test_final_condition_properties(
    state_: State, lost: bool, archived: str | None, retry: tuple[str, str | None] | None
) -> None:
    record = rec(state_)
    results = None if archived is None else {"status": archived, "location": "s3://b/k"}
    stored = None if retry is None else state(*retry)
    status = Status(record, T0 if lost else 0, results, stored)
    verdict = decide(When.FINAL, status)
    as_archived = decide(When.ARCHIVED, status)
    if state_ not in TERMINAL:
        assert verdict == as_archived  # open: pending, or LOST
        return
    is_final = retry is not None and retry[0] != RETRY_MEMBER and retry[1] == "final"
    if is_final:
        # written: success whatever the root's own state or its archive
        assert verdict == Success(
            {
                "record": record_to_json(record),
                "results": results or {},
                "final": final_view(root_doc("final")),
            }
        )
    elif retry is not None and retry[0] == RETRY_ACTIVE:
        # a FAILED root too, and one whose own results were lost: the lineage still ends in a
        # final result (a lost output's keys are its 'missing' lines)
        assert verdict is PENDING
    elif isinstance(as_archived, Success):
        # no retries (none, off, stopped, a child): exactly archived, final null
        assert verdict == Success({**as_archived.output, "final": None})
    else:
        assert verdict == as_archived


def test_a_failed_root_with_active_retries_waits_for_its_final_result() -> None:
    failed = rec(State.FAILED, error_message="some rows failed")
    archived = {"status": "archived", "location": "s3://b/summary.json"}
    as_archived = decide(When.ARCHIVED, Status(failed, results=archived))
    assert isinstance(as_archived, Failure) and as_archived.error == "FAILED"
    waiting = Status(failed, results=archived, retry=state(RETRY_ACTIVE, "pending"))
    assert decide(When.FINAL, waiting) is PENDING
    done = decide(When.FINAL, Status(failed, results=archived, retry=state(RETRY_DONE, "final")))
    assert isinstance(done, Success)
    assert done.output["final"] == {
        "status": "final",
        "location": FINAL_URI,
        "rows": {"total": 10, "answered": 9, "blocked": 1, "failed": 1},
        "errors": {"400": 1},
        "attempts": 2,
        "cost": {
            "usd": None,
            "retries_usd": None,
            "model": None,
            "prices": None,
            "batch_discount": None,
            "reason": REASON_FINAL_PREVIOUS_RELEASE,
        },
        "stopped": None,
    }
    assert done.output["record"]["state"] == "FAILED"
    # a root whose retries stopped without a final result is what archiving says
    stopped = decide(When.FINAL, Status(failed, results=archived, retry=state(RETRY_DONE, None)))
    assert isinstance(stopped, Failure) and stopped.error == "FAILED"


def test_final_of_reads_only_a_roots_written_final_result() -> None:
    assert final_of(None) is None
    assert final_of(state(RETRY_ACTIVE, "pending")) is None
    assert final_of(state(RETRY_MEMBER, None)) is None
    assert final_of({"status": RETRY_DONE, "doc": "not a map"}) is None
    assert final_of({"status": RETRY_DONE, "doc": {"final": ["x"]}}) is None
    assert final_of(state(RETRY_ACTIVE, "final")) == final_view(root_doc("final"))


def _rig(
    results: Mapping[str, Any] | None,
) -> tuple[MemoryStore, MemoryWaiterStore, FakeCallbacks, Resumer]:
    store = MemoryStore()
    waiters = MemoryWaiterStore()
    callbacks = FakeCallbacks()
    resumer = Resumer(
        waiters, store_status(store, lambda name: results), callbacks, targets=ALL_TARGETS
    )
    return store, waiters, callbacks, resumer


def test_the_resumer_reads_the_retry_state_and_resumes_after_final() -> None:
    """What the retry engine does after writing a final result: ``resume_after_final``."""
    results = {"status": "archived", "location": "s3://b/summary.json"}
    store, waiters, callbacks, resumer = _rig(results)
    root = rec(State.FAILED)
    store.put_if_absent(root)
    pending = RetryState(RETRY_ACTIVE, root.created_ns, 0, T0, root_doc("pending"))
    assert store.set_retry(root.name, 0, pending)
    waiters.add(Waiter(root.name, Target.STEP_FUNCTIONS, "final", When.FINAL), 5)
    waiters.add(Waiter(root.name, Target.STEP_FUNCTIONS, "archived", When.ARCHIVED), 5)
    tally = resume_after_final(resumer, root.name)
    assert tally is not None and tally.pending == 1
    assert [(c[0], c[1], c[2][0]) for c in callbacks.calls] == [("fail", "archived", "FAILED")]
    written = RetryState(RETRY_DONE, root.created_ns, 0, 0, root_doc("final"))
    assert store.set_retry(root.name, 1, written)
    tally = resume_after_final(resumer, root.name)
    assert tally is not None and len(tally.outcomes["succeeded"]) == 1
    assert callbacks.calls[-1] == (
        "succeed",
        "final",
        {"record": record_to_json(root), "results": results, "final": final_of(written.as_dict())},
    )
    assert waiters.list(root.name) == []
    again = resume_after_final(resumer, root.name)  # repeated: nothing left to resume
    assert again is not None and again.outcomes["succeeded"] == []
    assert resume_after_final(None, root.name) is None  # waiters off


def test_store_status_reads_the_retry_state_only_when_the_condition_needs_it() -> None:
    store = MemoryStore()
    read = store_status(store, lambda name: None)
    assert read("batches/a", True) == Status(None)
    root = rec(State.SUCCEEDED)
    store.put_if_absent(root)
    assert read(root.name, True).retry is None  # no retry state
    stored = RetryState(RETRY_ACTIVE, root.created_ns, 0, T0, root_doc("pending"))
    assert store.set_retry(root.name, 0, stored)
    assert read(root.name, False).retry is None
    assert read(root.name, True).retry == {**stored.as_dict(), "rev": 1}

    class Plain:  # a store without retry states (get/poll only)
        def get(self, name: str) -> Any:
            return store.get(name)

    assert store_status(Plain(), None)(root.name, True).retry is None  # type: ignore[arg-type]


def test_wait_until_final_follows_the_retry_state() -> None:
    store = MemoryStore()
    root = rec(State.SUCCEEDED)
    store.put_if_absent(root)
    assert store.set_retry(
        root.name, 0, RetryState(RETRY_ACTIVE, root.created_ns, 0, T0, root_doc("pending"))
    )
    read = store_status(store, lambda name: {"status": "archived"})
    assert wait_until(read, root.name, When.FINAL, timeout_s=0) is None
    assert store.set_retry(
        root.name, 1, RetryState(RETRY_DONE, root.created_ns, 0, 0, root_doc("final"))
    )
    done = wait_until(read, root.name, When.FINAL, timeout_s=0)
    assert done is not None
    verdict, status = done
    assert isinstance(verdict, Success) and verdict.output["final"]["location"] == FINAL_URI
    assert status.retry is not None and json.dumps(status.retry)


def test_the_resumer_lambda_takes_the_root_of_a_final_event() -> None:
    from opstate.waiters.wiring import names_in

    final_event = {"detail-type": "Operation Results Final", "detail": {"root": "batches/r"}}
    assert names_in(final_event) == ["batches/r"]
    assert names_in({"detail": {"name": "batches/n", "root": "batches/r"}}) == ["batches/n"]
