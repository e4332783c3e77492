"""``opstate serve`` answers requests in parallel: one slow store call does not stall the process.

While another process holds the SQLite file's write lock, a webhook write waits on it (up to
the store's busy timeout); a GET of another operation must still answer at once, and the write
goes through once the lock is released. Before, every request ran under one process-wide lock
(api/app.py), and the GET waited behind the write. The resolver's per-request state is per
thread: concurrent requests never read each other's request.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from opstate.local.apigw import LocalLambdaContext
from tests.support.serve_process import http, start_serve
from tests.support.webhooks import http_event

SECRET = "whsec_" + base64.b64encode(b"opstate-serve-parallel-secret-32").decode()


def signed_webhook(name: str) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(
        {
            "type": "batch.succeeded",
            "version": "v1",
            "timestamp": "2026-05-10T10:00:00Z",
            "data": {"id": name},
        }
    ).encode()
    msg_id = f"msg_{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    return raw, {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(msg_id, now, raw.decode()),
    }


def test_a_get_answers_within_a_second_while_a_write_waits_on_the_sqlite_lock(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ops.db"
    server = start_serve(
        ["--store", f"sqlite:///{db}"], cwd=tmp_path, env={"OPSTATE_WEBHOOK_SECRETS": SECRET}
    )
    other = sqlite3.connect(db, isolation_level=None)
    try:
        status, _, _ = http("PUT", f"{server.url}/operations/batches/read-me")
        assert status == 200
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        posted: dict[str, Any] = {}

        def post() -> None:
            raw, headers = signed_webhook("batches/written-later")
            started = time.monotonic()
            posted["status"], _, posted["answer"] = http(
                "POST", f"{server.url}/gemini/webhook", raw, headers, timeout=30
            )
            posted["seconds"] = time.monotonic() - started

        writer = threading.Thread(target=post)
        writer.start()
        time.sleep(0.5)  # the write is now waiting on the lock (busy timeout: 5 s)
        assert writer.is_alive(), f"the write did not wait on the lock: {posted}"
        started = time.monotonic()
        status, _, answer = http("GET", f"{server.url}/operations/batches/read-me", timeout=10)
        read_s = time.monotonic() - started
        assert (status, answer["name"]) == (200, "batches/read-me")
        assert read_s < 1.0, f"the GET waited {read_s:.2f} s behind a write"
        assert writer.is_alive(), "the write finished before the lock was released"
        other.execute("ROLLBACK")
        writer.join(timeout=30)
        assert posted["status"] == 200 and posted["answer"]["applied"] is True, posted
        assert posted["seconds"] >= 0.5
    finally:
        other.close()
        server.kill()


@pytest.mark.parametrize("threads", [8])
def test_concurrent_resolves_never_mix_their_requests(tmp_path: Path, threads: int) -> None:
    from opstate.api import create_app
    from opstate.config import Settings
    from opstate.signatures import StaticSecretsVerifier
    from opstate.store.memory import MemoryStore

    store = MemoryStore()
    app = create_app(
        store=store,
        verifier=StaticSecretsVerifier([SECRET]),
        settings=Settings(webhook_secrets=(SECRET,)),
        operations_auth=lambda _event: None,
    )
    context = LocalLambdaContext()
    names = [f"batches/mix-{i:03d}" for i in range(200)]
    barrier = threading.Barrier(threads)

    def put_then_get(name: str) -> tuple[str, str, str]:
        if name.endswith(("000", "001", "002", "003", "004", "005", "006", "007")):
            barrier.wait(timeout=10)  # the first requests start together
        put = app.resolve(http_event("PUT", f"/operations/{name}"), context)
        got = app.resolve(http_event("GET", f"/operations/{name}"), context)
        return name, json.loads(put["body"])["name"], json.loads(got["body"])["name"]

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: any shared state shows
    try:
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(put_then_get, names))
    finally:
        sys.setswitchinterval(interval)
    assert all(name == put == got for name, put, got in results), [
        r for r in results if len(set(r)) > 1
    ][:5]


def test_the_first_requests_of_every_route_at_once_are_all_answered() -> None:
    """The first requests of every route arriving together are all answered (Powertools built
    a route's middleware stack on its first request, and two threads taking it at once answered
    one of them 500), and what the app builds on first use (the waiters' registrar, the Pub/Sub
    receiver) is built once."""
    from opstate.api import create_app
    from opstate.config import Settings
    from opstate.signatures import StaticSecretsVerifier
    from opstate.store.memory import MemoryStore

    builds: list[str] = []

    def registrar_factory() -> None:
        builds.append("registrar")
        time.sleep(0.05)  # a slow build: the other first requests arrive meanwhile
        return None  # no waiter store: a waiter is refused with a 400

    app = create_app(
        store=MemoryStore(),
        verifier=StaticSecretsVerifier([SECRET]),
        settings=Settings(webhook_secrets=(SECRET,)),
        operations_auth=lambda _event: None,
        registrar_factory=registrar_factory,
    )
    waiter = json.dumps({"waiter": {"type": "step-functions", "token": "t"}}).encode()
    requests: list[tuple[dict[str, Any], int]] = []
    for i in range(4):
        raw, headers = signed_webhook(f"batches/first-{i}")
        requests += [
            (http_event("POST", "/gemini/webhook", body=raw, headers=headers), 200),
            (http_event("POST", "/google-cloud/pubsub", body=b"{}"), 401),  # not configured
            (http_event("GET", f"/operations/batches/none-{i}"), 404),
            (http_event("PUT", f"/operations/batches/wait-{i}", body=waiter), 400),
            (http_event("DELETE", f"/operations/batches/none-{i}"), 404),
        ]
    barrier = threading.Barrier(len(requests))
    context = LocalLambdaContext()

    def answer(event: dict[str, Any]) -> int:
        barrier.wait(timeout=10)
        return int(app.resolve(event, context)["statusCode"])

    with ThreadPoolExecutor(len(requests)) as pool:
        statuses = list(pool.map(answer, [event for event, _ in requests]))
    assert statuses == [status for _, status in requests]
    assert builds == ["registrar"]
