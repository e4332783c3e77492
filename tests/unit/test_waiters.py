"""Waiters: parsing a registration, the condition (property-tested), and the resumer's
delivery rules (at least once, safe to repeat, gone ends a waiter, throttling retried)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opstate.domain.model import OpRecord
from opstate.domain.states import TERMINAL, State
from opstate.domain.times import parse_time
from opstate.domain.views import record_to_json
from opstate.store.memory import MemoryStore
from opstate.waiters.enabled import ALL_TARGETS
from opstate.waiters.memory import MemoryWaiterStore
from opstate.waiters.model import (
    MAX_CAUSE_LENGTH,
    PENDING,
    Failure,
    InvalidWaiterError,
    Status,
    Success,
    Target,
    Waiter,
    When,
    decide,
    parse_waiter,
)
from opstate.waiters.port import (
    ARCHIVING_UNAVAILABLE,
    CallbackGoneError,
    CallbackRetryableError,
    TooManyWaitersError,
)
from opstate.waiters.run import ArchivingUnavailableError, Registrar, Resumer, store_status

T0 = parse_time("2026-06-01T10:00:00Z")
TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAA-secret-token"


def rec(state: State, name: str = "batches/a", **details: Any) -> OpRecord:
    return OpRecord(
        name=name,
        state=state,
        update_time_ns=T0,
        version=3,
        source="webhook",
        details=details,
        created_ns=T0,
        applied_ns=T0,
    )


# -- parsing --------------------------------------------------------------------------------------


def test_parse_a_step_functions_waiter_defaults_to_terminal() -> None:
    w = parse_waiter("batches/a", {"stepFunctionsTaskToken": TOKEN}, now_ns=T0)
    assert (w.name, w.target, w.token, w.when, w.created_ns) == (
        "batches/a",
        Target.STEP_FUNCTIONS,
        TOKEN,
        When.TERMINAL,
        T0,
    )
    assert TOKEN not in repr(w)
    assert len(w.waiter_id) == 32 and TOKEN not in w.waiter_id


def test_parse_a_durable_callback_waiter_until_archived() -> None:
    w = parse_waiter("batches/a", {"lambdaDurableCallbackId": "cb-1", "when": "archived"}, now_ns=1)
    assert (w.target, w.when) == (Target.LAMBDA_DURABLE, When.ARCHIVED)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ([], "JSON object"),
        ({}, "exactly one"),
        ({"stepFunctionsTaskToken": TOKEN, "lambdaDurableCallbackId": "x"}, "exactly one"),
        ({"stepFunctionsTaskToken": ""}, "non-empty"),
        ({"stepFunctionsTaskToken": 7}, "non-empty"),
        ({"stepFunctionsTaskToken": "x" * 1025}, "at most 1024"),
        ({"stepFunctionsTaskToken": "a\nb"}, "printable"),
        ({"stepFunctionsTaskToken": TOKEN, "when": "soon"}, "'when'"),
        ({"stepFunctionsTaskToken": TOKEN, "extra": 1}, "unknown waiter field"),
    ],
)
def test_bad_waiters_are_refused_without_echoing_the_token(body: Any, fragment: str) -> None:
    with pytest.raises(InvalidWaiterError) as caught:
        parse_waiter("batches/a", body, now_ns=T0)
    assert fragment in str(caught.value)
    assert TOKEN not in str(caught.value)


def test_the_same_token_has_the_same_id_and_targets_are_apart() -> None:
    a = Waiter("batches/a", Target.STEP_FUNCTIONS, "t")
    b = Waiter("batches/a", Target.STEP_FUNCTIONS, "t", When.ARCHIVED, 9)
    c = Waiter("batches/a", Target.LAMBDA_DURABLE, "t")
    assert a.waiter_id == b.waiter_id != c.waiter_id


# -- the condition --------------------------------------------------------------------------------

states = st.sampled_from(list(State))
archive = st.sampled_from([None, "pending", "archived", "none", "failed", "expired"])


@given(
    state=states,
    lost=st.booleans(),
    status=archive,
    when=st.sampled_from([When.TERMINAL, When.ARCHIVED]),  # final: test_waiters_final.py
)
def test_condition_properties(state: State, lost: bool, status: str | None, when: When) -> None:
    record = rec(state)
    results = None if status is None else {"status": status, "location": "s3://b/k"}
    verdict = decide(when, Status(record, T0 if lost else 0, results))
    if state not in TERMINAL:
        # an open operation: pending unless lost, whatever the results say
        assert verdict == (Failure("LOST", verdict.cause) if lost else PENDING)  # type: ignore[union-attr]
        return
    if isinstance(verdict, Success):
        assert state is State.SUCCEEDED
        assert verdict.output["record"]["state"] == "SUCCEEDED"
        assert verdict.output["results"] == (results if when is When.ARCHIVED else None)
        if when is When.ARCHIVED:
            assert status in ("archived", "none")
    elif isinstance(verdict, Failure):
        assert verdict.error in (str(state), "RESULTS_EXPIRED")
        assert json.loads(verdict.cause)["name"] == "batches/a"
        assert len(verdict.cause) <= MAX_CAUSE_LENGTH
        if verdict.error == "RESULTS_EXPIRED":
            assert when is When.ARCHIVED and status == "expired"
    else:
        # only an archived wait on a terminal operation is still pending, never a terminal one
        assert when is When.ARCHIVED and status in (None, "pending", "failed")
        assert status is not None or state is State.SUCCEEDED
    if when is When.TERMINAL:
        assert verdict is not PENDING


def test_untracked_operation_is_pending() -> None:
    assert decide(When.TERMINAL, Status(None)) is PENDING


def test_failure_cause_carries_the_error_details_clipped() -> None:
    failed = rec(State.FAILED, error_code=13, error_message="x" * 5000)
    verdict = decide(When.TERMINAL, Status(failed))
    assert isinstance(verdict, Failure) and verdict.error == "FAILED"
    cause = json.loads(verdict.cause)
    assert cause["error_code"] == 13 and len(cause["error_message"]) == 1000
    assert cause["updateTime"] == "2026-06-01T10:00:00.000000000Z"


# -- registration ---------------------------------------------------------------------------------


def test_registration_is_bounded_and_idempotent() -> None:
    registrar = Registrar(MemoryWaiterStore(), limit=2, archiving=False, targets=ALL_TARGETS)
    one = Waiter("batches/a", Target.STEP_FUNCTIONS, "t1")
    assert registrar.register(one) is True
    assert registrar.register(one) is False  # same token: a no-op, never counted twice
    registrar.register(Waiter("batches/a", Target.STEP_FUNCTIONS, "t2"))
    with pytest.raises(TooManyWaitersError):
        registrar.register(Waiter("batches/a", Target.STEP_FUNCTIONS, "t3"))
    registrar.register(Waiter("batches/b", Target.STEP_FUNCTIONS, "t3"))  # per operation


def test_archived_is_refused_where_archiving_is_not_built() -> None:
    registrar = Registrar(MemoryWaiterStore(), limit=2, archiving=False, targets=ALL_TARGETS)
    with pytest.raises(ArchivingUnavailableError, match=ARCHIVING_UNAVAILABLE):
        registrar.register(Waiter("batches/a", Target.STEP_FUNCTIONS, "t", When.ARCHIVED))
    assert registrar.waiters.list("batches/a") == []


# -- resuming -------------------------------------------------------------------------------------


class FakeCallbacks:
    """Records calls; ``script`` lists exceptions to raise on the next calls (None: succeed)."""

    def __init__(self, *script: Exception | None) -> None:
        self.script = list(script)
        self.calls: list[tuple[str, str, Any]] = []

    def _next(self) -> None:
        if self.script:
            exc = self.script.pop(0)
            if exc is not None:
                raise exc

    def succeed(self, waiter: Waiter, output: Mapping[str, Any]) -> None:
        self.calls.append(("succeed", waiter.token, dict(output)))
        self._next()

    def fail(self, waiter: Waiter, error: str, cause: str) -> None:
        self.calls.append(("fail", waiter.token, (error, json.loads(cause))))
        self._next()


def setup(
    callbacks: FakeCallbacks, results: dict[str, Any] | None = None
) -> tuple[MemoryStore, MemoryWaiterStore, Resumer, list[float]]:
    store = MemoryStore()
    waiters = MemoryWaiterStore()
    slept: list[float] = []
    reader = (lambda name: results) if results is not None else (lambda name: None)
    resumer = Resumer(
        waiters, store_status(store, reader), callbacks, targets=ALL_TARGETS, sleep=slept.append
    )
    return store, waiters, resumer, slept


def test_a_waiter_on_a_running_job_waits_then_resumes_once_with_the_record() -> None:
    callbacks = FakeCallbacks()
    store, waiters, resumer, _ = setup(callbacks)
    store.put_if_absent(rec(State.RUNNING))
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, TOKEN), 5)
    assert resumer.resume("batches/a").pending == 1
    assert callbacks.calls == []
    done = rec(State.SUCCEEDED)
    assert store.replace_if_version(done, 3).ok
    before = store.get("batches/a")
    tally = resumer.resume("batches/a")
    assert len(tally.outcomes["succeeded"]) == 1
    output = {"record": record_to_json(done), "results": None}
    assert callbacks.calls == [("succeed", TOKEN, output)]
    assert waiters.list("batches/a") == []  # removed once resumed
    assert resumer.resume("batches/a").outcomes["succeeded"] == []  # not resumed twice
    assert store.get("batches/a") == before  # the record is never written


def test_failed_and_lost_operations_fail_their_waiters() -> None:
    callbacks = FakeCallbacks()
    store, waiters, resumer, _ = setup(callbacks)
    store.put_if_absent(rec(State.FAILED, name="batches/f", error_message="boom"))
    store.put_if_absent(rec(State.RUNNING, name="batches/l"))
    from opstate.store.port import PollState

    assert store.set_poll("batches/l", 3, PollState(lost_ns=T0 + 5))
    waiters.add(Waiter("batches/f", Target.STEP_FUNCTIONS, "tf"), 5)
    waiters.add(Waiter("batches/l", Target.LAMBDA_DURABLE, "tl"), 5)
    resumer.resume("batches/f")
    resumer.resume("batches/l")
    assert [(c[0], c[1], c[2][0]) for c in callbacks.calls] == [
        ("fail", "tf", "FAILED"),
        ("fail", "tl", "LOST"),
    ]
    assert callbacks.calls[0][2][1]["error_message"] == "boom"
    assert callbacks.calls[1][2][1]["lostAt"] == "2026-06-01T10:00:00.000000005Z"


def test_a_gone_task_ends_the_waiter_without_harm() -> None:
    callbacks = FakeCallbacks(CallbackGoneError("TaskTimedOut"))
    store, waiters, resumer, slept = setup(callbacks)
    store.put_if_absent(rec(State.SUCCEEDED))
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, "t"), 5)
    tally = resumer.resume("batches/a")
    assert len(tally.outcomes["gone"]) == 1 and slept == []
    assert waiters.list("batches/a") == []
    assert len(callbacks.calls) == 1


def test_throttling_is_retried_with_backoff_then_left_for_the_next_delivery() -> None:
    callbacks = FakeCallbacks(
        CallbackRetryableError("ThrottlingException"), CallbackRetryableError("500"), None
    )
    store, waiters, resumer, slept = setup(callbacks)
    store.put_if_absent(rec(State.SUCCEEDED))
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, "t"), 5)
    tally = resumer.resume("batches/a")
    assert len(tally.outcomes["succeeded"]) == 1 and len(callbacks.calls) == 3
    assert len(slept) == 2 and all(s >= 0 for s in slept)

    always = FakeCallbacks(*[CallbackRetryableError("ThrottlingException")] * 10)
    store, waiters, resumer, slept = setup(always)
    store.put_if_absent(rec(State.SUCCEEDED))
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, "t"), 5)
    tally = resumer.resume("batches/a")
    assert len(tally.retry_later) == 1 and len(always.calls) == resumer.attempts
    assert len(waiters.list("batches/a")) == 1  # kept: the trigger delivers again


def test_archived_waits_for_the_archive_then_carries_the_results() -> None:
    results: dict[str, Any] = {"status": "pending"}
    callbacks = FakeCallbacks()
    store, waiters, resumer, _ = setup(callbacks, results)
    store.put_if_absent(rec(State.SUCCEEDED))
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, "t", When.ARCHIVED), 5)
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, "u", When.TERMINAL), 5)
    tally = resumer.resume("batches/a")
    assert tally.pending == 1 and len(tally.outcomes["succeeded"]) == 1
    results.update(status="archived", location="s3://bucket/batches/a/")
    resumer.resume("batches/a")
    assert callbacks.calls[-1][0:2] == ("succeed", "t")
    assert callbacks.calls[-1][2]["results"]["location"] == "s3://bucket/batches/a/"


def test_archived_fails_when_the_results_expired() -> None:
    callbacks = FakeCallbacks()
    store, waiters, resumer, _ = setup(callbacks, {"status": "expired"})
    store.put_if_absent(rec(State.SUCCEEDED))
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, "t", When.ARCHIVED), 5)
    resumer.resume("batches/a")
    assert callbacks.calls[0][0] == "fail" and callbacks.calls[0][2][0] == "RESULTS_EXPIRED"


def test_archived_resumes_after_none() -> None:
    callbacks = FakeCallbacks()
    store, waiters, resumer, _ = setup(callbacks, {"status": "none"})
    store.put_if_absent(rec(State.SUCCEEDED))
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, "t", When.ARCHIVED), 5)
    resumer.resume("batches/a")
    assert callbacks.calls[0][0] == "succeed"
    assert callbacks.calls[0][2]["results"] == {"status": "none"}


# -- the resumer Lambda's events ------------------------------------------------------------------


def test_names_from_bus_events_and_waiter_stream_inserts() -> None:
    from opstate.waiters.wiring import names_in

    assert names_in({"detail-type": "Operation Lost", "detail": {"name": "batches/a"}}) == [
        "batches/a"
    ]
    stream = {
        "Records": [
            {"eventName": "INSERT", "dynamodb": {"Keys": {"name": {"S": "batches/a"}}}},
            {"eventName": "INSERT", "dynamodb": {"Keys": {"name": {"S": "batches/a"}}}},
            {"eventName": "REMOVE", "dynamodb": {"Keys": {"name": {"S": "batches/r"}}}},
            {"eventName": "INSERT", "dynamodb": {"Keys": {"name": {"S": "batches/b"}}}},
            {
                "eventName": "INSERT",
                "dynamodb": {"Keys": {"name": {"S": "batches/c"}, "waiter_id": {"S": "#count"}}},
            },
        ]
    }
    assert names_in(stream) == ["batches/a", "batches/b"]
    assert names_in({"detail": {}}) == [] and names_in({}) == []


def test_names_from_operations_stream_modifies() -> None:
    """An archive settled as none/expired announces nothing on the bus: the operations table's
    stream (MODIFY, keyed by name alone) wakes the resumer instead; a REMOVE never does."""
    from opstate.waiters.wiring import names_in

    def rec(event_name: str, **keys: str) -> dict[str, object]:
        return {
            "eventName": event_name,
            "dynamodb": {"Keys": {k: {"S": v} for k, v in keys.items()}},
        }

    stream = {
        "Records": [
            rec("MODIFY", name="batches/none"),
            rec("REMOVE", name="batches/ttl"),
            rec("MODIFY", name="batches/c", waiter_id="#count"),
            rec("MODIFY", name="batches/none"),
            rec("INSERT", name="batches/w", waiter_id="abc"),
        ]
    }
    assert names_in(stream) == ["batches/none", "batches/w"]


def test_the_resumer_hears_archives_settled_without_an_event() -> None:
    """The template feeds the resumer the operations table's MODIFYs whose archive status is
    none or expired (filtered), so a ``when: archived`` waiter on an operation with no output
    is resumed in AWS too."""
    import json

    from tests.support.template import load_template

    events = load_template()["Resources"]["WaiterResumerFunction"]["Properties"]["Events"]
    (settled,) = [
        e["Properties"]
        for e in events.values()
        if e["Type"] == "DynamoDB"
        and e["Properties"]["Stream"] == {"Fn::GetAtt": ["OperationsTable", "StreamArn"]}
    ]
    (pattern,) = [json.loads(f["Pattern"]) for f in settled["FilterCriteria"]["Filters"]]
    assert pattern["eventName"] == ["MODIFY"]
    statuses = pattern["dynamodb"]["NewImage"]["archive_status"]["S"]
    assert set(statuses) == {"none", "expired"}


def test_the_handler_fails_the_invocation_when_a_resume_must_be_retried() -> None:
    from opstate.waiters.wiring import ResumeLaterError, handle

    callbacks = FakeCallbacks(*[CallbackRetryableError("ThrottlingException")] * 4, None)
    store, waiters, resumer, _ = setup(callbacks)
    store.put_if_absent(rec(State.SUCCEEDED))
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, TOKEN), 5)
    event = {"detail-type": "Operation State Changed", "detail": {"name": "batches/a"}}
    with pytest.raises(ResumeLaterError) as caught:
        handle(event, resumer)
    assert TOKEN not in str(caught.value)
    assert handle(event, resumer)["succeeded"] == 1  # the retried delivery resumes it


def test_the_results_port_turns_archived_on_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    from opstate.config import Settings
    from opstate.waiters import wiring

    store = MemoryStore()
    waiters = wiring.waiter_store_for(store, Settings())
    assert isinstance(waiters, MemoryWaiterStore)
    # The build archives results: the outcomes work's view is the port's default.
    from opstate.outcomes.results import results_json as outcomes_results_json

    assert wiring.RESULTS_JSON is outcomes_results_json
    monkeypatch.setattr(wiring, "RESULTS_JSON", None)  # a build without results archiving
    registrar = wiring.registrar_for(waiters, Settings(max_waiters=4))
    assert registrar is not None and (registrar.archiving, registrar.limit) == (False, 4)
    assert wiring.results_reader_for(store) is None

    calls: list[tuple[object, str]] = []

    def results_json(s: object, name: str) -> dict[str, Any]:
        calls.append((s, name))
        return {"status": "none"}

    monkeypatch.setattr(wiring, "RESULTS_JSON", results_json)
    registrar = wiring.registrar_for(waiters, Settings())
    assert registrar is not None and registrar.archiving is True
    store.put_if_absent(rec(State.SUCCEEDED))
    callbacks = FakeCallbacks()
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, "t", When.ARCHIVED), 4)
    enabled = Settings(waiter_state_machine_arns=("*",))
    wiring.resumer_for(store, waiters, enabled, callbacks).resume("batches/a")
    assert calls == [(store, "batches/a")]
    assert callbacks.calls[0][2]["results"] == {"status": "none"}


def test_a_dynamodb_store_without_a_waiters_table_has_no_waiters() -> None:
    from opstate.config import Settings
    from opstate.store.dynamodb import DynamoDBStore
    from opstate.waiters import wiring
    from opstate.waiters.dynamodb import DynamoDBWaiterStore

    store = DynamoDBStore("ops", client=object())
    assert wiring.waiter_store_for(store, Settings()) is None
    assert wiring.registrar_for(None, Settings()) is None
    kept = wiring.waiter_store_for(store, Settings(waiters_table_name="waiters"))
    assert isinstance(kept, DynamoDBWaiterStore) and kept.table_name == "waiters"


def test_waiter_settings() -> None:
    from opstate.config import ConfigError, Settings

    env = {"OPSTATE_WAITERS_TABLE_NAME": " waiters-prod ", "OPSTATE_MAX_WAITERS_PER_OPERATION": "3"}
    settings = Settings.from_env(env)
    assert (settings.waiters_table_name, settings.max_waiters) == ("waiters-prod", 3)
    assert Settings.from_env({}).max_waiters == 10
    for bad in ("0", "-1", "many", "1.5"):
        with pytest.raises(ConfigError, match="OPSTATE_MAX_WAITERS_PER_OPERATION"):
            Settings.from_env({"OPSTATE_MAX_WAITERS_PER_OPERATION": bad})


# -- enabled kinds (issue 31: no confused deputy) -------------------------------------------------

STATE_MACHINE = "arn:aws:states:eu-west-1:123456789012:stateMachine:flow"


def test_the_waiter_arns_are_read_and_checked() -> None:
    from opstate.config import ConfigError, Settings
    from opstate.waiters.enabled import enabled_targets

    assert Settings.from_env({}).waiter_state_machine_arns == ()
    assert enabled_targets(Settings.from_env({})) == frozenset()  # the default: none
    # What the template passes: its CommaDelimitedList joined with commas ("" when empty).
    empty = {"OPSTATE_WAITER_STATE_MACHINE_ARNS": "", "OPSTATE_WAITER_DURABLE_FUNCTION_ARNS": ""}
    assert enabled_targets(Settings.from_env(empty)) == frozenset()
    env = {
        "OPSTATE_WAITER_STATE_MACHINE_ARNS": f" {STATE_MACHINE}, {STATE_MACHINE}-2 ,",
        "OPSTATE_WAITER_DURABLE_FUNCTION_ARNS": "*",
    }
    settings = Settings.from_env(env)
    assert settings.waiter_state_machine_arns == (STATE_MACHINE, f"{STATE_MACHINE}-2")
    assert settings.waiter_durable_function_arns == ("*",)
    assert enabled_targets(settings) == frozenset(Target)
    only_sfn = Settings.from_env({"OPSTATE_WAITER_STATE_MACHINE_ARNS": STATE_MACHINE})
    assert enabled_targets(only_sfn) == {Target.STEP_FUNCTIONS}
    # A value meant to turn waiters off must not turn them on.
    for bad in ("none", "off", "false", f"{STATE_MACHINE},flow"):
        with pytest.raises(ConfigError, match="OPSTATE_WAITER_STATE_MACHINE_ARNS must be ARNs"):
            Settings.from_env({"OPSTATE_WAITER_STATE_MACHINE_ARNS": bad})


@pytest.mark.parametrize(
    ("target", "parameter"),
    [
        (Target.STEP_FUNCTIONS, "WaiterStateMachineArns"),
        (Target.LAMBDA_DURABLE, "WaiterDurableFunctionArns"),
    ],
)
def test_a_kind_that_is_not_enabled_is_refused_before_anything_is_kept(
    target: Target, parameter: str
) -> None:
    from opstate.config import Settings
    from opstate.waiters import wiring
    from opstate.waiters.enabled import TargetNotEnabledError

    waiters = MemoryWaiterStore()
    registrar = wiring.registrar_for(waiters, Settings())
    assert registrar is not None
    waiter = Waiter("batches/a", target, TOKEN)
    with pytest.raises(TargetNotEnabledError) as caught:
        registrar.register(waiter)
    assert f"waiters are not enabled: set {parameter} " in str(caught.value)
    assert TOKEN not in str(caught.value)
    assert waiters.list("batches/a") == []
    other = next(t for t in Target if t is not target)
    enabling = {
        Target.STEP_FUNCTIONS: Settings(waiter_state_machine_arns=(STATE_MACHINE,)),
        Target.LAMBDA_DURABLE: Settings(waiter_durable_function_arns=("*",)),
    }
    registrar = wiring.registrar_for(waiters, enabling[other])  # the other kind only
    assert registrar is not None
    with pytest.raises(TargetNotEnabledError):
        registrar.register(waiter)
    registrar = wiring.registrar_for(waiters, enabling[target])
    assert registrar is not None and registrar.register(waiter) is True


def test_the_resumer_never_answers_a_kind_that_is_not_enabled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A waiter kept before its kind was disabled (an upgrade from the old ``*`` default, a
    SQLite file from another run): its token is never sent, the waiter ends as gone."""
    from opstate.config import Settings
    from opstate.waiters import wiring

    store = MemoryStore()
    waiters = MemoryWaiterStore()
    store.put_if_absent(rec(State.SUCCEEDED))
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, TOKEN), 5)
    waiters.add(Waiter("batches/a", Target.LAMBDA_DURABLE, "callback-1"), 5)
    callbacks = FakeCallbacks()
    only_sfn = Settings(waiter_state_machine_arns=(STATE_MACHINE,))
    tally = wiring.resumer_for(store, waiters, only_sfn, callbacks).resume("batches/a")
    assert [c[:2] for c in callbacks.calls] == [("succeed", TOKEN)]
    assert (len(tally.outcomes["succeeded"]), len(tally.outcomes["gone"])) == (1, 1)
    assert waiters.list("batches/a") == []
    (gone,) = [r for r in caplog.records if r.getMessage() == "waiter gone"]
    assert gone.__dict__["code"] == "WaitersNotEnabled"
    assert all("callback-1" not in str(r.__dict__) for r in caplog.records)
    waiters.add(Waiter("batches/a", Target.STEP_FUNCTIONS, TOKEN), 5)
    tally = wiring.resumer_for(store, waiters, Settings(), callbacks).resume("batches/a")
    assert len(callbacks.calls) == 1 and len(tally.outcomes["gone"]) == 1  # nothing sent
