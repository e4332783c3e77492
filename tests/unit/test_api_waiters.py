"""``PUT /operations/{name}`` with a ``waiter``: checked with the report before anything is
written, kept (bounded, idempotent), resumed at once when its condition already holds, and its
token never shown by the API or written to a log."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from opstate.api import create_app
from opstate.config import Settings
from opstate.signatures import StaticSecretsVerifier
from opstate.store import MemoryStore
from opstate.waiters.enabled import ALL_TARGETS
from opstate.waiters.memory import MemoryWaiterStore
from opstate.waiters.model import Waiter
from opstate.waiters.port import ARCHIVING_UNAVAILABLE, WaiterStoreUnavailableError
from opstate.waiters.run import Registrar, Resumer, store_status
from tests.support.webhooks import EVENT_TIMESTAMP, TEST_SECRET, operation_event

NAME = "batches/wait-1"
TOKEN = "AAAAKgAAAAIAAAAAAAAAA-the-secret-task-token-" + "z" * 40


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def succeed(self, waiter: Waiter, output: Mapping[str, Any]) -> None:
        self.calls.append(("succeed", waiter.token, output))

    def fail(self, waiter: Waiter, error: str, cause: str) -> None:
        self.calls.append(("fail", waiter.token, error))


def _app(*, archiving: bool = False, limit: int = 2, waiters: Any = None) -> Any:
    store = MemoryStore()
    waiters = waiters if waiters is not None else MemoryWaiterStore()
    callbacks = Recorder()
    reader = (lambda name: {"status": "archived", "location": "s3://b/k"}) if archiving else None
    resumer = Resumer(
        waiters, store_status(store, reader), callbacks, targets=ALL_TARGETS, sleep=lambda s: None
    )
    app = create_app(
        store=store,
        verifier=StaticSecretsVerifier([TEST_SECRET], clock_s=lambda: EVENT_TIMESTAMP),
        settings=Settings(),
        registrar=Registrar(waiters, limit=limit, archiving=archiving, targets=ALL_TARGETS),
        on_waiter=resumer.resume,
    )
    return app, store, waiters, callbacks


def _put(app: Any, body: Mapping[str, Any], name: str = NAME) -> tuple[int, dict[str, Any]]:
    answer = app.resolve(operation_event("PUT", name, json.dumps(body).encode()), None)
    return answer["statusCode"], json.loads(answer["body"])


def test_a_waiter_on_a_running_job_is_kept_and_resumed_when_it_ends(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app, store, waiters, callbacks = _app()
    status, body = _put(app, {"state": "RUNNING", "waiter": {"stepFunctionsTaskToken": TOKEN}})
    assert status == 200 and body["state"] == "RUNNING"
    assert body["waiter"] == {
        "id": waiters.list(NAME)[0].waiter_id,
        "when": "terminal",
        "added": True,
    }
    assert TOKEN not in json.dumps(body)
    assert callbacks.calls == []
    status, again = _put(app, {"state": "RUNNING", "waiter": {"stepFunctionsTaskToken": TOKEN}})
    assert again["waiter"]["added"] is False and len(waiters.list(NAME)) == 1
    # the job ends (any report; the resumer in AWS is triggered by the bus)
    _put(app, {"state": "SUCCEEDED", "updateTime": "2026-03-01T00:00:00Z"})
    Resumer(waiters, store_status(store, None), callbacks, targets=ALL_TARGETS).resume(NAME)
    assert [c[0:2] for c in callbacks.calls] == [("succeed", TOKEN)]
    assert callbacks.calls[0][2]["record"]["state"] == "SUCCEEDED"
    assert waiters.list(NAME) == []
    # the read API never shows a waiter or its token
    answer = app.resolve(operation_event("GET", NAME), None)
    assert answer["statusCode"] == 200 and TOKEN not in answer["body"]
    logged = capsys.readouterr()
    logged_text = logged.out + logged.err + caplog.text
    assert "waiter registered" in logged_text and "waiter succeeded" in logged_text
    assert TOKEN not in logged_text


def test_a_waiter_on_a_finished_job_is_resumed_at_once() -> None:
    app, _, waiters, callbacks = _app()
    _put(app, {"state": "FAILED", "details": {"error_message": "quota"}})
    status, _ = _put(app, {"waiter": {"stepFunctionsTaskToken": TOKEN}})
    assert status == 200
    assert callbacks.calls == [("fail", TOKEN, "FAILED")]
    assert waiters.list(NAME) == []


def test_the_waiter_does_not_change_the_record() -> None:
    app, store, _, _ = _app()
    _put(app, {"state": "RUNNING", "updateTime": "2026-01-01T00:00:00Z"})
    before = store.get(NAME)
    _put(
        app,
        {
            "state": "RUNNING",
            "updateTime": "2026-01-01T00:00:00Z",
            "waiter": {"stepFunctionsTaskToken": TOKEN},
        },
    )
    assert store.get(NAME) == before


@pytest.mark.parametrize(
    ("waiter", "status", "code", "message"),
    [
        (
            {"stepFunctionsTaskToken": TOKEN, "when": "archived"},
            400,
            "archiving-not-available",
            ARCHIVING_UNAVAILABLE,
        ),
        ({"stepFunctionsTaskToken": TOKEN, "when": "later"}, 400, "invalid-waiter", "'when'"),
        ({"stepFunctionsTaskToken": ""}, 400, "invalid-waiter", "non-empty"),
        ("token", 400, "invalid-waiter", "JSON object"),
    ],
)
def test_a_bad_waiter_is_refused_and_nothing_is_written(
    waiter: Any, status: int, code: str, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    app, store, waiters, _ = _app()
    with caplog.at_level(logging.DEBUG):
        got, body = _put(app, {"state": "RUNNING", "waiter": waiter})
    assert (got, body["error"]) == (status, code) and message in body["message"]
    assert store.get(NAME) is None and waiters.list(NAME) == []
    assert TOKEN not in caplog.text and TOKEN not in json.dumps(body)


def test_archived_is_accepted_where_archiving_is_built() -> None:
    app, _, _, callbacks = _app(archiving=True)
    status, body = _put(
        app, {"state": "SUCCEEDED", "waiter": {"stepFunctionsTaskToken": TOKEN, "when": "archived"}}
    )
    assert status == 200 and body["waiter"]["when"] == "archived"
    assert callbacks.calls[0][2]["results"] == {"status": "archived", "location": "s3://b/k"}


def test_too_many_waiters_is_409_and_writes_nothing() -> None:
    app, store, waiters, _ = _app(limit=1)
    _put(app, {"state": "RUNNING", "waiter": {"stepFunctionsTaskToken": "one"}})
    before = store.get(NAME)
    status, body = _put(
        app,
        {
            "state": "RUNNING",
            "updateTime": "2026-04-01T00:00:00Z",
            "waiter": {"stepFunctionsTaskToken": "two"},
        },
    )
    assert (status, body["error"]) == (409, "too-many-waiters")
    assert store.get(NAME) == before and len(waiters.list(NAME)) == 1


def test_an_unavailable_waiter_store_is_503_and_the_report_is_not_applied() -> None:
    class Down(MemoryWaiterStore):
        def add(self, waiter: Waiter, limit: int) -> bool:
            raise WaiterStoreUnavailableError("down")

    app, store, _, _ = _app(waiters=Down())
    status, body = _put(app, {"state": "RUNNING", "waiter": {"stepFunctionsTaskToken": TOKEN}})
    assert (status, body["error"]) == (503, "unavailable")
    assert store.get(NAME) is None


def test_without_waiters_a_waiter_is_refused() -> None:
    app = create_app(
        store=MemoryStore(),
        verifier=StaticSecretsVerifier([TEST_SECRET], clock_s=lambda: EVENT_TIMESTAMP),
        settings=Settings(),
    )
    status, body = _put(app, {"waiter": {"stepFunctionsTaskToken": TOKEN}})
    assert (status, body["error"]) == (400, "waiters-not-enabled")


# -- issue 31: waiters are off until the operator names the ARNs they may resume ----------------


def _deployed_app(settings: Settings) -> tuple[Any, MemoryStore, MemoryWaiterStore, Recorder]:
    """The app as the Lambda and ``opstate serve`` wire it: registrar and resumer from settings."""
    from opstate.waiters.wiring import registrar_for, resumer_for

    store, waiters, callbacks = MemoryStore(), MemoryWaiterStore(), Recorder()
    resumer = resumer_for(store, waiters, settings, callbacks)

    def on_waiter(name: str) -> None:
        resumer.resume(name)

    app = create_app(
        store=store,
        verifier=StaticSecretsVerifier([TEST_SECRET], clock_s=lambda: EVENT_TIMESTAMP),
        settings=settings,
        registrar=registrar_for(waiters, settings),
        on_waiter=on_waiter,
    )
    return app, store, waiters, callbacks


@pytest.mark.parametrize(
    ("field", "parameter"),
    [
        ("stepFunctionsTaskToken", "WaiterStateMachineArns"),
        ("lambdaDurableCallbackId", "WaiterDurableFunctionArns"),
    ],
)
def test_by_default_a_waiter_is_refused_and_nothing_is_written(
    field: str, parameter: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The confused deputy: a producer allowed only to report attaches another workflow's task
    token to its own job and reports it SUCCEEDED. With no ARNs named, nothing is kept, nothing
    is ingested and no token is answered."""
    app, store, waiters, callbacks = _deployed_app(Settings.from_env({}))
    with caplog.at_level(logging.DEBUG):
        status, body = _put(
            app, {"state": "SUCCEEDED", "details": {"forged": True}, "waiter": {field: TOKEN}}
        )
    assert (status, body["error"]) == (400, "waiters-not-enabled")
    assert f"waiters are not enabled: set {parameter} (" in body["message"]
    assert body["message"].endswith("ARNs whose tasks may be resumed")
    assert store.get(NAME) is None and waiters.list(NAME) == [] and callbacks.calls == []
    assert TOKEN not in caplog.text and TOKEN not in json.dumps(body)


def test_naming_the_state_machines_enables_step_functions_waiters_only() -> None:
    arn = "arn:aws:states:eu-west-1:123456789012:stateMachine:flow"
    env = {"OPSTATE_WAITER_STATE_MACHINE_ARNS": arn, "OPSTATE_WAITER_DURABLE_FUNCTION_ARNS": ""}
    app, _, waiters, callbacks = _deployed_app(Settings.from_env(env))
    status, body = _put(app, {"state": "SUCCEEDED", "waiter": {"stepFunctionsTaskToken": TOKEN}})
    assert status == 200 and body["waiter"]["added"] is True
    assert [c[:2] for c in callbacks.calls] == [("succeed", TOKEN)]
    # The output is the record as the job's reporters wrote it (docs/waiters.md).
    assert callbacks.calls[0][2]["record"]["state"] == "SUCCEEDED"
    status, body = _put(app, {"waiter": {"lambdaDurableCallbackId": "callback-1"}})
    assert (status, body["error"]) == (400, "waiters-not-enabled")
    assert "set WaiterDurableFunctionArns" in body["message"] and waiters.list(NAME) == []
