"""``opstate serve``: the Lambda's API behind a local HTTP server, run as a subprocess.

Webhooks are signed with the ``standardwebhooks`` package (independent of the code under test).
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from http.client import HTTPException
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from standardwebhooks.webhooks import Webhook

from opstate.config import Settings
from opstate.domain.events import from_report
from opstate.ingest import ingest
from opstate.local.apigw import build_event, response_parts
from opstate.store import store_from_url
from tests.support.serve_process import (
    OPSTATE,
    TEST_API_TOKEN,
    cli_env,
    http,
    run_cli,
    start_serve,
)

T_WEBHOOK = "2026-05-10T10:00:00Z"
SECRET = "whsec_" + base64.b64encode(b"opstate-serve-test-secret-32byte").decode()


def signed(body: dict, secret: str = SECRET, msg_id: str | None = None) -> tuple[bytes, dict]:
    raw = json.dumps(body).encode()
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    signature = Webhook(secret).sign(msg_id, now, raw.decode())
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }
    return raw, headers


def webhook_body(name: str, kind: str = "batch.succeeded", ts: str = "2026-05-10T10:00:00Z"):
    return {"type": kind, "version": "v1", "timestamp": ts, "data": {"id": name}}


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'db' / 'ops.db'}"


@pytest.fixture
def serve(tmp_path: Path, store_url: str):
    started = []

    def start(*args: str, env: dict | None = None):
        env = {"OPSTATE_WEBHOOK_SECRETS": SECRET, **(env or {})}
        proc = start_serve(["--store", store_url, *args], cwd=tmp_path, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


# --- the request -> event mapping ----------------------------------------------------------------


def test_build_event_is_an_http_api_v2_event():
    event = build_event(
        "PUT",
        "/operations/v1beta/batches%2Fabc?x=1&x=2&y=",
        [("Host", "127.0.0.1:3000"), ("X-Thing", "a"), ("x-thing", "b"), ("Cookie", "c=1; d=2")],
        b'{"state": "RUNNING"}',
    )
    assert event["version"] == "2.0"
    assert event["rawPath"] == "/operations/v1beta/batches%2Fabc"
    assert event["rawQueryString"] == "x=1&x=2&y="
    assert event["queryStringParameters"] == {"x": "1,2", "y": ""}
    assert event["headers"] == {"host": "127.0.0.1:3000", "x-thing": "a,b"}
    assert event["cookies"] == ["c=1", "d=2"]
    assert event["requestContext"]["http"]["method"] == "PUT"
    assert event["requestContext"]["http"]["path"] == "/operations/v1beta/batches%2Fabc"
    assert event["requestContext"]["stage"] == "$default"
    assert event["routeKey"] == "PUT /operations/{name+}"
    assert event["pathParameters"] == {"name": "v1beta/batches/abc"}
    assert event["body"] == '{"state": "RUNNING"}'
    assert event["isBase64Encoded"] is False


def test_build_event_base64_encodes_a_body_that_is_not_utf8():
    raw = b"\xff\xfe\x00binary"
    event = build_event("POST", "/gemini/webhook", [], raw)
    assert event["isBase64Encoded"] is True
    assert base64.b64decode(event["body"]) == raw
    assert event["routeKey"] == "POST /gemini/webhook"
    assert "pathParameters" not in event


def test_response_parts_decode_base64_bodies_and_cookies():
    status, headers, body = response_parts(
        {
            "statusCode": 503,
            "headers": {"Retry-After": "1"},
            "cookies": ["a=b"],
            "body": base64.b64encode(b"\x00\x01").decode(),
            "isBase64Encoded": True,
        }
    )
    assert status == 503
    assert ("Retry-After", "1") in headers and ("Set-Cookie", "a=b") in headers
    assert body == b"\x00\x01"


# --- the running server ------------------------------------------------------------------------


def test_webhooks_and_reports_round_trip_and_match_the_cli(serve, tmp_path, store_url):
    server = serve()
    raw, headers = signed(webhook_body("batches/rt-1"))
    status, _, answer = http("POST", f"{server.url}/gemini/webhook", raw, headers)
    assert status == 200
    assert answer == {
        "applied": True,
        "reason": "created",
        "name": "batches/rt-1",
        "state": "SUCCEEDED",
        "version": 1,
    }

    # A redelivery (same id, new attempt) is deliberately dropped, not applied twice.
    raw, headers = signed(webhook_body("batches/rt-1"))
    status, _, answer = http("POST", f"{server.url}/gemini/webhook", raw, headers)
    assert (status, answer["applied"], answer["version"]) == (200, False, 1)

    # A report via PUT, then a slow poll saying RUNNING with an older time: never regresses.
    status, _, answer = http("PUT", f"{server.url}/operations/batches/rt-2")
    assert (status, answer["state"], answer["reason"]) == (200, "PENDING", "created")
    body = json.dumps({"state": "RUNNING", "updateTime": "2026-05-10T10:00:00.5+00:00"}).encode()
    status, _, answer = http("PUT", f"{server.url}/operations/batches/rt-2", body)
    assert (status, answer["state"], answer["version"]) == (200, "RUNNING", 2)
    body = json.dumps({"state": "RUNNING", "updateTime": "2026-05-10T10:00:00Z"}).encode()
    status, _, answer = http("PUT", f"{server.url}/operations/batches/rt-2", body)
    assert (status, answer["applied"], answer["reason"]) == (
        200,
        False,
        "stale-or-equal-update-time",
    )

    # Wrong signature: 401, nothing written.
    raw, headers = signed(webhook_body("batches/rt-3"), secret="whsec_" + "A" * 43 + "=")
    status, _, answer = http("POST", f"{server.url}/gemini/webhook", raw, headers)
    assert status == 401 and answer["message"] == "invalid signature"
    status, _, _ = http("GET", f"{server.url}/operations/batches/rt-3")
    assert status == 404

    # GET (any spelling of the name) and `opstate get --json` return the same object.
    status, _, via_api = http("GET", f"{server.url}/operations/batches/rt-2")
    assert status == 200
    status, _, via_alias = http("GET", f"{server.url}/operations/v1beta/batches%2Frt-2")
    assert via_alias == via_api
    assert via_api["state"] == "RUNNING" and via_api["version"] == 2
    result = run_cli(["get", "batches/rt-2", "--json", "--store", store_url], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == via_api

    # Each state change was printed once, as one line.
    out = server.output()
    assert "batches/rt-1  (new) -> SUCCEEDED  v1" in out
    assert "batches/rt-2  (new) -> PENDING  v1" in out
    assert "batches/rt-2  PENDING -> RUNNING  v2" in out
    assert out.count("batches/rt-1  ") == 1  # the dropped redelivery printed nothing
    assert '"_aws"' not in out  # no EMF metric blobs locally
    assert server.terminate() == 0


def test_sigterm_during_a_burst_loses_no_acknowledged_event(serve, tmp_path, store_url):
    server = serve()
    total = 240
    acked: dict[str, str] = {}
    failed = 0
    lock = threading.Lock()
    enough = threading.Event()

    def send(i: int) -> None:
        nonlocal failed
        name = f"batches/burst-{i}"
        try:
            if i % 2:
                raw, headers = signed(webhook_body(name, "batch.failed"))
                status, _, answer = http("POST", f"{server.url}/gemini/webhook", raw, headers)
                expected = "FAILED"
            else:
                body = json.dumps({"state": "RUNNING"}).encode()
                status, _, answer = http("PUT", f"{server.url}/operations/{name}", body)
                expected = "RUNNING"
        except (OSError, HTTPException):
            with lock:
                failed += 1
            return
        if status == 200:
            assert answer["name"] == name and answer["state"] == expected
            with lock:
                acked[name] = expected
                if len(acked) >= 40:
                    enough.set()
        else:
            with lock:
                failed += 1

    with ThreadPoolExecutor(max_workers=24) as pool:
        futures = [pool.submit(send, i) for i in range(total)]
        assert enough.wait(30), server.output()
        server.send_signal(signal.SIGTERM)
        for future in futures:
            future.result()
    assert server.terminate() == 0
    out = server.output()
    assert "stopping: finishing in-flight requests" in out and "stopped" in out
    assert len(acked) >= 40
    assert len(acked) + failed == total

    # A second start on the same database continues where the first one stopped.
    again = serve()
    for name, state in acked.items():
        status, _, record = http("GET", f"{again.url}/operations/{name}")
        assert status == 200, f"{name} was acknowledged but is missing"
        assert record["state"] == state
    first = sorted(acked)[0]
    status, _, answer = http(
        "PUT", f"{again.url}/operations/{first}", json.dumps({"state": "CANCELLED"}).encode()
    )
    assert status == 200
    if acked[first] == "RUNNING":
        assert (answer["applied"], answer["version"]) == (True, 2)
    else:
        assert (answer["applied"], answer["reason"]) == (False, "terminal-conflict")
    assert again.terminate() == 0


def printed_block(lines: list[str], header: str) -> list[str]:
    """The indented lines serve printed under the line starting with ``header``."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header)) + 1
    block = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def test_without_secrets_one_is_generated_once_with_mode_0600(tmp_path, store_url):
    server = start_serve(["--store", store_url], cwd=tmp_path)
    try:
        path = tmp_path / ".opstate" / "webhook-secret"
        assert path.exists()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        secret = path.read_text().strip()
        assert secret.startswith("whsec_")
        assert len(base64.b64decode(secret.removeprefix("whsec_"))) >= 24
        out = server.output()
        assert secret in out  # printed at the start that generated it
        assert f"{server.url}/gemini/webhook" in out
        assert "curl" in out and "webhook-signature" in out

        raw, headers = signed(webhook_body("batches/gen-1"), secret=secret)
        status, _, answer = http("POST", f"{server.url}/gemini/webhook", raw, headers)
        assert (status, answer["state"]) == (200, "SUCCEEDED")

        if shutil.which("curl") and shutil.which("openssl") and shutil.which("bash"):
            # The printed snippets are ready to paste: run them as printed, the redelivery in
            # the same shell, and get the answers they announce.
            lines = out.splitlines()
            snippet = printed_block(lines, "signed test webhook (paste into a shell):")
            again = printed_block(lines, "the same signed delivery again, as Gemini retries it")
            assert any("answers" in line and "created" in line for line in snippet)
            assert any("stale-or-equal-update-time" in line for line in again)
            result = subprocess.run(
                ["bash", "-c", "\n".join(snippet + again)],
                capture_output=True,
                text=True,
                timeout=20,
                cwd=tmp_path,
            )
            assert result.returncode == 0, result.stderr
            first, second = (json.loads(line) for line in result.stdout.splitlines())
            assert (first["name"], first["applied"], first["reason"]) == (
                "batches/demo-1",
                True,
                "created",
            )
            assert (second["applied"], second["reason"], second["version"]) == (
                False,
                "stale-or-equal-update-time",
                first["version"],
            )
            # Pasted again a second later: a new body time, so "refreshed" (as printed).
            time.sleep(1.1)
            result = subprocess.run(
                ["bash", "-c", "\n".join(snippet)],
                capture_output=True,
                text=True,
                timeout=20,
                cwd=tmp_path,
            )
            assert json.loads(result.stdout)["reason"] == "refreshed", result.stdout
        assert server.terminate() == 0
    finally:
        server.kill()

    again = start_serve(["--store", store_url], cwd=tmp_path)
    try:
        assert path.read_text().strip() == secret  # reused, not regenerated
        assert secret not in again.output()
        assert "webhook secrets: 1 from" in again.output()
        status, _, _ = http("GET", f"{again.url}/operations/batches/gen-1")
        assert status == 200
    finally:
        again.kill()


def test_secret_file_changes_are_picked_up_without_a_restart(tmp_path, store_url):
    from opstate.local.secret_file import write_secret_file

    path = tmp_path / ".opstate" / "webhook-secret"
    write_secret_file(path, [SECRET])
    server = start_serve(["--store", store_url], cwd=tmp_path)
    try:
        other = "whsec_" + base64.b64encode(os.urandom(32)).decode()
        raw, headers = signed(webhook_body("batches/rot-1"), secret=other)
        assert http("POST", f"{server.url}/gemini/webhook", raw, headers)[0] == 401
        time.sleep(0.01)  # a distinct mtime on coarse file systems
        write_secret_file(path, [other, SECRET])  # what `opstate webhooks rotate` writes
        raw, headers = signed(webhook_body("batches/rot-1"), secret=other)
        assert http("POST", f"{server.url}/gemini/webhook", raw, headers)[0] == 200
        raw, headers = signed(webhook_body("batches/rot-2"), secret=SECRET)
        assert http("POST", f"{server.url}/gemini/webhook", raw, headers)[0] == 200
        assert server.terminate() == 0
    finally:
        server.kill()


def test_port_in_use_is_one_sentence_and_exit_1(serve, tmp_path, store_url):
    server = serve()
    port = server.url.rsplit(":", 1)[1]
    result = run_cli(
        ["serve", "--port", port, "--store", store_url],
        cwd=tmp_path,
        env={"OPSTATE_WEBHOOK_SECRETS": SECRET},
    )
    assert result.returncode == 1
    assert result.stderr.startswith("opstate: error: cannot listen on 127.0.0.1:")
    assert "Traceback" not in result.stderr


def test_reconciler_runs_on_a_timer_when_a_key_is_set(serve, fake_gemini):
    fake_gemini.put_batch("batches/polled-1", "BATCH_STATE_SUCCEEDED", update_time=T_WEBHOOK)
    server = serve(
        "--reconcile-every",
        "0.5",
        env={"GEMINI_API_KEY": "test-key", "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url},
    )
    assert "reconciler: every 0.5 s" in server.output()
    line = server.wait_for_line(r"batches/polled-1  \(new\) -> SUCCEEDED  v1  \(poll\)", 30)
    assert line
    server.wait_for_line(r"reconcile: .*discovered=1", 10)
    status, _, record = http("GET", f"{server.url}/operations/batches/polled-1")
    assert (status, record["state"], record["source"]) == (200, "SUCCEEDED", "poll")
    # The operations page sees the reconciler's decisions too (its log and its cursor).
    status, _, page = http("GET", f"{server.url}/ui/api/operation?name=batches/polled-1")
    assert status == 200
    assert [(d["source"], d["state"], d["applied"]) for d in page["decisions"]][:1] == [
        ("poll", "SUCCEEDED", True)
    ]
    assert server.terminate() == 0


def test_a_reconciler_pass_with_errors_says_the_first_as_a_sentence(serve, fake_gemini):
    fake_gemini.fail("webhooks", 403, message="API key not valid")
    server = serve(
        "--reconcile-every",
        "3600",
        env={"GEMINI_API_KEY": "test-key", "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url},
    )
    line = server.wait_for_line(r"reconcile: 1 error\(s\); the first: ", 30)
    assert line.strip().endswith(
        "webhook listing failed (HTTP 403): PERMISSION_DENIED: API key not valid"
    )
    server.wait_for_line(r"reconcile: .*errors=1", 10)
    assert server.terminate() == 0


def test_shutdown_still_works_when_stdout_went_away(tmp_path, store_url):
    # e.g. `opstate serve | head -n 20`: printing fails, serving and stopping must not.
    process = subprocess.Popen(
        [*OPSTATE, "serve", "--port", "0", "--store", store_url],
        cwd=tmp_path,
        env=cli_env({"OPSTATE_WEBHOOK_SECRETS": SECRET}),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = ""
        for line in process.stdout:
            if line.startswith("listening on "):
                url = line.split()[-1]
                break
        process.stdout.close()
        for i in range(3):  # each prints a state-change line into the closed pipe
            status, _, _ = http("PUT", f"{url}/operations/batches/pipe-{i}")
            assert status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    again = start_serve(
        ["--store", store_url], cwd=tmp_path, env={"OPSTATE_WEBHOOK_SECRETS": SECRET}
    )
    try:
        assert http("GET", f"{again.url}/operations/batches/pipe-2")[0] == 200
    finally:
        again.kill()


def test_serve_ignores_the_table_name_and_says_what_chose_its_store(tmp_path):
    """OPSTATE_TABLE_NAME (the deployed table, the other commands' default) never makes the
    local server write DynamoDB: the store is --store, else OPSTATE_STORE, else SQLite."""
    env = {"OPSTATE_WEBHOOK_SECRETS": SECRET, "OPSTATE_TABLE_NAME": "ops-deployed"}
    server = start_serve([], cwd=tmp_path, env=env)
    try:
        first = server.output().splitlines()[0]
        # the default file's absolute path too: where the jobs are after a cd (issue 49)
        where = tmp_path.resolve() / ".opstate" / "ops.db"
        assert first == (
            f"opstate serve: store sqlite:///.opstate/ops.db ({where}) (chosen by the default)"
        )
        raw, headers = signed(webhook_body("batches/local-1"))
        assert http("POST", f"{server.url}/gemini/webhook", raw, headers)[0] == 200
        assert (tmp_path / ".opstate" / "ops.db").exists()
        assert server.terminate() == 0
    finally:
        server.kill()
    env["OPSTATE_STORE"] = f"sqlite:///{tmp_path / 'chosen.db'}"
    server = start_serve([], cwd=tmp_path, env=env)
    try:
        assert server.output().splitlines()[0] == (
            f"opstate serve: store {env['OPSTATE_STORE']} (chosen by OPSTATE_STORE)"
        )
    finally:
        server.kill()


def test_terminal_records_past_their_retention_are_purged_at_start(serve, store_url):
    three_days_ago = time.time_ns() - 3 * 86_400 * 10**9
    store = store_from_url(store_url, Settings(retention_days=1))
    for name, state in (("batches/old-done", "SUCCEEDED"), ("batches/old-open", "RUNNING")):
        body = {"state": state, "updateTime": "2026-01-01T00:00:00Z"}
        event = from_report(name, body, now_ns=three_days_ago)
        assert ingest(store, event, clock_ns=lambda: three_days_ago).applied
    store.close()

    proc = serve()

    assert "retention: removed 1 terminal record(s) past their expires_at" in proc.output()
    assert http("GET", f"{proc.url}/operations/batches/old-done")[0] == 404
    assert http("GET", f"{proc.url}/operations/batches/old-open")[0] == 200


# --- request parsing (issue: a chunk size of -1 read the connection to its end) ------------------


def raw_exchange(url: str, head: bytes, pieces: list[bytes], timeout: float = 10) -> bytes:
    """Send ``head`` then ``pieces`` on one connection that stays open (no EOF from us), stop
    sending once the server answers, and read the answer until the server closes."""
    split = urlsplit(url)
    with socket.create_connection((split.hostname, split.port), timeout=timeout) as sock:
        sock.sendall(head)
        for piece in pieces:
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered already
            try:
                sock.sendall(piece)
            except OSError:
                break  # the server refused the rest
        answer = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
    return answer


def chunked_head(name: str) -> bytes:
    return (
        f"PUT /operations/{name} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Authorization: Bearer {TEST_API_TOKEN}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()


def parse_answer(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


@pytest.mark.parametrize(
    ("label", "pieces"),
    [
        # The old parser read a -1 chunk with read(-1): to the end of the connection.
        ("negative-size", [b"-1\r\n", *([b"x" * 1024] * 64)]),
        ("non-hex-size", [b"zz\r\n", b"{}\r\n0\r\n\r\n"]),
        # A trailer that never ends: bounded, refused, not read forever.
        (
            "endless-trailer",
            [b"2\r\n{}\r\n0\r\n", *([b"X-Trailer: " + b"a" * 1000 + b"\r\n"] * 200)],
        ),
        ("endless-size-line", [b"2\r\n{}\r\n", *([b"0" * 1024] * 64)]),
    ],
)
def test_malformed_chunked_bodies_are_refused_and_the_server_keeps_serving(serve, label, pieces):
    server = serve()
    answer = raw_exchange(server.url, chunked_head(f"batches/chunk-{label}"), pieces)
    assert answer, f"no answer to {label}"
    status, body = parse_answer(answer)
    assert status == 400 and body["error"] == "invalid-request", (status, body)
    # Nothing was written and the server still answers, chunked bodies included.
    assert http("GET", f"{server.url}/operations/batches/chunk-{label}")[0] == 404
    body_ok = json.dumps({"state": "RUNNING"}).encode()
    good = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body_ok), body_ok)
    status, record = parse_answer(
        raw_exchange(server.url, chunked_head("batches/chunk-ok"), [good])
    )
    assert (status, record["state"]) == (200, "RUNNING")
    assert server.terminate() == 0


def test_a_body_over_10_mib_gets_the_api_413(serve):
    server = serve()
    body = b"{" + b" " * (10 * 1024 * 1024) + b"}"
    status, _, answer = http("PUT", f"{server.url}/operations/batches/too-big", body)
    assert (status, answer["error"]) == (413, "payload-too-large")
    head = (
        b"PUT /operations/batches/too-big HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Connection: close\r\nContent-Length: 20000000\r\n\r\n"
    )
    status, answer = parse_answer(raw_exchange(server.url, head, []))
    assert (status, answer["error"]) == (413, "payload-too-large")
    assert http("GET", f"{server.url}/operations/batches/too-big")[0] == 404
    assert server.terminate() == 0
