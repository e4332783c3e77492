"""``opstate serve`` with waiters: registered over HTTP (bearer token) into the SQLite file's own
``waiters`` table, resumed on a worker thread after the change that ends the job, through boto3
(here moto server's Step Functions); an unreachable Step Functions never fails a request and
leaves the waiter registered. As in AWS, waiters are off until their ARNs are named (issue 31):
here through ``OPSTATE_WAITER_STATE_MACHINE_ARNS``."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from opstate.config import Settings
from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.local.waiters import LocalWaiters
from opstate.store import store_from_url
from opstate.waiters.model import Target, Waiter
from opstate.waiters.sqlite import SQLiteWaiterStore
from tests.support.motoserver import MotoServer, free_port
from tests.support.serve_process import http, start_serve

NAME = "batches/serve-waiter"
TOKEN = "serve-task-token-" + "s" * 40
# moto's Step Functions answers any state machine's tokens: name them all, explicitly.
WAITERS_ON = {"OPSTATE_WAITER_STATE_MACHINE_ARNS": "*"}
WAITERS_OFF: dict[str, str | None] = {
    "OPSTATE_WAITER_STATE_MACHINE_ARNS": None,
    "OPSTATE_WAITER_DURABLE_FUNCTION_ARNS": None,
}


def _waiters(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT waiter_id FROM waiters WHERE name = ?", (NAME,))]


def _until(check, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _put(url: str, body: dict[str, object]) -> tuple[int, object]:
    status, _, answer = http(
        "PUT",
        f"{url}/operations/{NAME}",
        json.dumps(body).encode(),
        {"content-type": "application/json"},
    )
    return status, answer


def test_serve_registers_then_resumes_when_the_job_ends(
    tmp_path: Path, moto_server: MotoServer
) -> None:
    env = {"AWS_ENDPOINT_URL_SFN": moto_server.endpoint, **WAITERS_ON}
    server = start_serve(["--store", "sqlite:///ops.db"], cwd=tmp_path, env=env)
    db = tmp_path / "ops.db"
    try:
        status, answer = _put(
            server.url, {"state": "RUNNING", "waiter": {"stepFunctionsTaskToken": TOKEN}}
        )
        assert status == 200 and answer["waiter"]["added"] is True  # type: ignore[index]
        time.sleep(0.5)
        assert len(_waiters(db)) == 1  # running: kept
        status, _ = _put(server.url, {"state": "SUCCEEDED", "updateTime": "2026-06-01T00:00:00Z"})
        assert status == 200
        _until(lambda: _waiters(db) == [])  # resumed (moto accepts the call) and removed
        assert TOKEN not in server.output()
    finally:
        server.terminate()


def test_an_unreachable_step_functions_keeps_the_waiter(tmp_path: Path) -> None:
    env = {"AWS_ENDPOINT_URL_SFN": f"http://127.0.0.1:{free_port()}", **WAITERS_ON}
    server = start_serve(["--store", "sqlite:///ops.db", "--verbose"], cwd=tmp_path, env=env)
    db = tmp_path / "ops.db"
    try:
        status, answer = _put(
            server.url, {"state": "FAILED", "waiter": {"stepFunctionsTaskToken": TOKEN}}
        )
        assert status == 200, answer
        server.wait_for_line("waiter retry-later", timeout=30)  # tried, failed, kept
        assert len(_waiters(db)) == 1
        assert http("GET", f"{server.url}/operations/{NAME}")[0] == 200
        assert TOKEN not in server.output()
    finally:
        server.terminate()


def test_serve_refuses_waiters_until_their_arns_are_named(tmp_path: Path) -> None:
    """The same default as the stack: a producer with the API token cannot have this process
    answer a task token with whatever AWS credentials it finds; nothing is kept or ingested."""
    server = start_serve(["--store", "sqlite:///ops.db"], cwd=tmp_path, env=WAITERS_OFF)
    try:
        status, answer = _put(
            server.url, {"state": "SUCCEEDED", "waiter": {"stepFunctionsTaskToken": TOKEN}}
        )
        assert status == 400 and answer["error"] == "waiters-not-enabled"  # type: ignore[index]
        assert (
            "set WaiterStateMachineArns (OPSTATE_WAITER_STATE_MACHINE_ARNS for opstate serve)"
            in answer["message"]  # type: ignore[index]
        )
        assert _waiters(tmp_path / "ops.db") == []
        assert http("GET", f"{server.url}/operations/{NAME}")[0] == 404  # nothing ingested
        assert TOKEN not in server.output()
    finally:
        server.terminate()


def test_the_local_resumer_never_answers_a_kind_that_is_not_enabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter kept in the file by an earlier run that had them on: with the variable unset,
    its token is never sent (the waiter ends as gone). Were it sent, it would go to a closed
    port on 127.0.0.1 and stay registered."""
    for key in WAITERS_OFF:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SFN", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    db = tmp_path / "ops.db"
    settings = Settings.from_env({})
    store = store_from_url(f"sqlite:///{db}", settings)
    store.put_if_absent(
        OpRecord(name=NAME, state=State.SUCCEEDED, update_time_ns=1, version=1, source="api")
    )
    SQLiteWaiterStore(db).add(Waiter(NAME, Target.STEP_FUNCTIONS, TOKEN), 10)
    local = LocalWaiters(store, settings)
    local.soon(NAME)
    local.stop()  # the worker has handled NAME when it stops
    assert _waiters(db) == []
    assert local.registrar is not None and local.registrar.targets == frozenset()
