"""Load on ``opstate serve`` over real HTTP on 127.0.0.1: 8 concurrent senders, 500 operations,
shuffled and duplicated signed deliveries. Zero 5xx except 503s that a retry resolves; every
final state, read back with GET, is its timeline's last event."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from opstate.domain.times import parse_time
from tests.reliability.support import (
    SECRET,
    Delivery,
    delivery_request,
    shuffled_deliveries,
    timelines,
)
from tests.support.motoserver import free_port
from tests.support.serve_process import TEST_API_TOKEN

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("opstate.local.serve") is None, reason="opstate.local is not built yet"
)

OPERATIONS = 500
SENDERS = 8
MAX_SENDS = 20


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    log: Path


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    env = dict(os.environ)
    env["OPSTATE_WEBHOOK_SECRETS"] = SECRET
    env["OPSTATE_API_TOKEN"] = TEST_API_TOKEN
    env.pop("GEMINI_API_KEY", None)
    env.pop("OPSTATE_STORE", None)
    env.pop("OPSTATE_TABLE_NAME", None)
    log = tmp_path / "serve.log"
    script = Path(sys.executable).with_name("opstate")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "opstate.cli"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *command,
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--store",
                f"sqlite:///{tmp_path / 'load.db'}",
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                pytest.fail(f"opstate serve exited {process.returncode}: {log.read_text()[-2000:]}")
            try:
                status, _ = request(port, "GET", "/operations/batches/not-there")
                if status == 404:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"opstate serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield Server(process, port, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def request(
    port: int,
    method: str,
    path: str,
    body: str | None = None,
    headers: dict[str, str] | None = None,
    conn: http.client.HTTPConnection | None = None,
) -> tuple[int, Any]:
    own = conn is None
    connection = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        sent = {"authorization": f"Bearer {TEST_API_TOKEN}", **(headers or {})}
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        raw = response.read()
        return response.status, (json.loads(raw) if raw else None)
    finally:
        if own:
            connection.close()


@dataclass
class LoadLog:
    statuses: dict[int, int] = field(default_factory=dict)
    unresolved: list[tuple[Delivery, int]] = field(default_factory=list)
    other_5xx: list[tuple[Delivery, int, Any]] = field(default_factory=list)
    client_errors: list[tuple[Delivery, int, Any]] = field(default_factory=list)
    acked: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def send_lane(port: int, lane: list[Delivery], log: LoadLog) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for d in lane:
            for attempt in range(MAX_SENDS):
                method, path, body, headers = delivery_request(d)
                path = "/operations/" + quote(d.name, safe="/") if method == "PUT" else path
                try:
                    status, answer = request(port, method, path, body, headers, conn)
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    status, answer = request(port, method, path, body, headers, conn)
                with log.lock:
                    log.statuses[status] = log.statuses.get(status, 0) + 1
                if status == 200:
                    with log.lock:
                        log.acked += 1
                    break
                if status == 503:
                    time.sleep(0.002 * (attempt + 1))
                    continue
                with log.lock:
                    (log.other_5xx if status >= 500 else log.client_errors).append(
                        (d, status, answer)
                    )
                break
            else:
                with log.lock:
                    log.unresolved.append((d, MAX_SENDS))
    finally:
        conn.close()


@pytest.mark.timeout(240)
def test_serve_under_load_loses_nothing(server: Server) -> None:
    rng = random.Random(500)
    lines = timelines(OPERATIONS, rng, prefix="load")
    deliveries = shuffled_deliveries(lines, rng, max_copies=2)
    events = sum(len(e) for e in lines.values())
    assert len(deliveries) > events  # duplicated, and shuffled below
    assert any(d.webhook for d in deliveries) and not all(d.webhook for d in deliveries)
    log = LoadLog()
    lanes = [deliveries[i::SENDERS] for i in range(SENDERS)]
    threads = [threading.Thread(target=send_lane, args=(server.port, lane, log)) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=200)
    assert not any(t.is_alive() for t in threads), "senders did not finish in time"

    assert log.other_5xx == [], log.other_5xx[:5]
    assert log.unresolved == [], "a 503 was never resolved by retrying"
    assert log.client_errors == [], log.client_errors[:5]
    assert log.acked == len(deliveries)
    assert set(log.statuses) <= {200, 503}, log.statuses

    wrong = []
    for name, timeline in lines.items():
        status, record = request(server.port, "GET", "/operations/" + quote(name, safe="/"))
        truth = timeline[-1]
        if (
            status != 200
            or record["state"] != truth.state.value
            or record["updateTime"] is None
            or parse_time(record["updateTime"]) != truth.ns
        ):
            wrong.append((name, status, record, truth))
    assert wrong == [], wrong[:5]
    assert server.process.poll() is None, "the server died under load"
