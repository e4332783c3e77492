"""``opstate serve`` with waiters: registered over HTTP (bearer token) into the SQLite file's own
``waiters`` table, resumed on a worker thread after the change that ends the job, through boto3
(here moto server's Step Functions); an unreachable Step Functions never fails a request and
leaves the waiter registered."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from tests.support.motoserver import MotoServer, free_port
from tests.support.serve_process import http, start_serve

NAME = "batches/serve-waiter"
TOKEN = "serve-task-token-" + "s" * 40


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
    env = {"AWS_ENDPOINT_URL_SFN": moto_server.endpoint}
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
    env = {"AWS_ENDPOINT_URL_SFN": f"http://127.0.0.1:{free_port()}"}
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
