"""Issue 24 section 4, the local server's part: what ``opstate serve`` and ``opstate replay``
print never carries a client's control characters; ``opstate replay FILE`` caps a line like an
API body; ``opstate serve`` answers only the Host names it should (DNS rebinding); and its
webhook route verifies dynamic-webhook JWTs as the Lambda does when ``OPSTATE_PUBLIC_URL`` is
set.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from opstate.api.webhook import proof_headers
from opstate.local.hosts import AllowedHosts, host_name
from opstate.quarantine import Delivery, SQLiteQuarantine
from opstate.terminal import printable, printable_lines
from tests.support.serve_process import cli_env, http, run_cli, start_serve
from tests.support.webhooks import TEST_SECRET, signed_headers
from tests.unit.test_signatures import AUDIENCE, ISSUER, JwksServer, Signer

HOOK = b'{"type":"batch.succeeded","timestamp":"2026-05-10T09:00:00Z","data":{"id":"batches/j1"}}'


def raw_request(url: str, request: bytes) -> bytes:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(request)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# -- one escape for everything printed --------------------------------------------------------


def test_printable_escapes_control_characters_and_keeps_text() -> None:
    assert printable("a\x1b[2Jb\x07\r\n\x9b\u202e\u2028") == (
        "a\\x1b[2Jb\\x07\\x0d\\x0a\\x9b\\u202e\\u2028"
    )
    assert printable("batches/élan\tok ✓") == "batches/élan\tok ✓"
    assert printable_lines("one\ntwo\x1b") == "one\ntwo\\x1b"


def test_serve_verbose_never_prints_a_clients_escape_sequence(tmp_path: Path) -> None:
    server = start_serve(
        ["--store", "memory://", "--verbose"],
        cwd=tmp_path,
        env={"OPSTATE_WEBHOOK_SECRETS": TEST_SECRET},
    )
    try:
        host = urlsplit(server.url).netloc.encode()
        answer = raw_request(
            server.url,
            b"GET /\x1b[2J\x1b]0;pwned\x07 HTTP/1.1\r\nHost: " + host + b"\r\n"
            b"Connection: close\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 404")
        line = server.wait_for_line(r'"GET /')
        assert "\x1b" not in line and "\x07" not in line
        assert "\\x1b[2J\\x1b]0;pwned\\x07" in line
        assert server.terminate() == 0
    finally:
        server.kill()


def test_replay_never_prints_a_lines_escape_sequence(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text(
        json.dumps(
            {"name": "batches/x", "state": "RUNNING", "details": {"k\x1b]0;t\x07": "\ud800"}}
        )
        + "\n"
    )
    result = run_cli(["replay", str(path), "--store", "memory://"], cwd=tmp_path)
    assert result.returncode == 1
    assert "\x1b" not in result.stderr + result.stdout and "\x07" not in result.stderr
    assert "$.k\\x1b]0;t\\x07" in result.stderr


# -- opstate replay FILE: a line is capped like an API body -----------------------------------


def test_a_line_over_the_body_cap_is_a_bad_line_and_the_replay_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    ok = json.dumps({"name": "batches/after", "state": "RUNNING"})
    exact = json.dumps({"name": "batches/fits", "state": "RUNNING", "details": {"p": ""}})
    exact = exact.replace('"p": ""', '"p": "' + "y" * (4096 - len(exact)) + '"')
    assert len(exact) == 4096
    with path.open("w") as fh:
        fh.write(json.dumps({"name": "batches/big", "details": {"x": "x" * 9000}}) + "\n")
        fh.write(exact + "\n")
        fh.write(ok + "\n")
    result = run_cli(
        ["replay", str(path), "--store", "memory://", "--json"],
        cwd=tmp_path,
        env={"OPSTATE_MAX_BODY_BYTES": "4096"},
    )
    summary = json.loads(result.stdout)
    assert [(b["line"], b["error"]) for b in summary["badLines"]] == [(1, "line-too-long")]
    assert "longer than 4096 bytes" in summary["badLines"][0]["message"]
    assert (summary["lines"], summary["applied"], summary["bad"]) == (3, 2, 1)
    assert f"{path}:1: " in result.stderr


def test_a_huge_line_is_read_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as fh:
        fh.write(b'{"name":"batches/huge","details":{"x":"')
        block = b"x" * (1 << 20)
        for _ in range(96):  # a 96 MiB line
            fh.write(block)
        fh.write(b'"}}\n{"name":"batches/after","state":"RUNNING"}\n')
    # The peak RSS of the child's own address space (VmHWM): getrusage's ru_maxrss would carry
    # the parent's peak across fork + exec (Linux keeps it in the signal struct).
    probe = (
        "import sys\n"
        "from opstate.cli.app import main\n"
        "code = main(sys.argv[1:])\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
        "sys.stderr.write('maxrss_kb=%s\\n' % hwm)\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, "replay", str(path), "--store", "memory://", "--json"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = json.loads(result.stdout)
    assert (summary["applied"], summary["bad"]) == (1, 1), result.stderr
    maxrss_mb = int(result.stderr.rsplit("maxrss_kb=", 1)[1].split()[0]) / 1024
    assert maxrss_mb < 96, f"{maxrss_mb:.0f} MB for a 96 MiB line"


# -- Host names (DNS rebinding) ---------------------------------------------------------------


def test_host_names_are_parsed_strictly() -> None:
    assert host_name("127.0.0.1:3000") == "127.0.0.1"
    assert host_name("LocalHost.") == "localhost"
    assert host_name("[::1]:3000") == "::1"
    assert host_name("a:b:c") == "a:b:c"  # not a name anything allows
    for bad in ("", "host:port", "[::1", "[::1]x", "h:123456"):
        assert host_name(bad) is None, bad
    allowed = AllowedHosts("0.0.0.0", "https://Hooks.Example.Test/gemini/webhook", ["tun.test"])
    for ok in ("localhost:3000", "app.localhost", "127.0.0.1", "127.8.0.1:1", "[::1]:3000"):
        assert allowed.allows(ok), ok
    for ok in ("hooks.example.test", "hooks.example.test:443", "tun.test"):
        assert allowed.allows(ok), ok
    for bad in ("evil.test", "127.0.0.1.evil.test", "localhost.evil.test", "0.0.0.0", "[::2]"):
        assert not allowed.allows(bad), bad
    assert AllowedHosts("192.168.1.5").allows("192.168.1.5:3000")


def test_serve_answers_only_loopback_and_configured_host_names(tmp_path: Path) -> None:
    server = start_serve(
        ["--store", "memory://", "--allow-host", "tunnel.example.test"],
        cwd=tmp_path,
        env={"OPSTATE_WEBHOOK_SECRETS": TEST_SECRET},
    )
    try:
        url = f"{server.url}/operations/batches/h1"
        port = urlsplit(server.url).port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "tunnel.example.test"):
            assert http("PUT", url, headers={"Host": host})[0] == 200, host
        for host in ("rebind.attacker.test", f"rebind.attacker.test:{port}"):
            status, _, answer = http("GET", url, headers={"Host": host})
            assert (status, answer["error"]) == (421, "misdirected-request"), host
        status, _, _ = http("GET", f"{server.url}/", headers={"Host": "rebind.attacker.test"})
        assert status == 421  # the operations page too
        no_host = raw_request(server.url, b"GET /operations/batches/h1 HTTP/1.0\r\n\r\n")
        assert no_host.startswith(b"HTTP/1.0 400") or no_host.startswith(b"HTTP/1.1 400")
        assert server.terminate() == 0
    finally:
        server.kill()


# -- OPSTATE_PUBLIC_URL: the local webhook route verifies JWTs as the Lambda does ------------


@pytest.fixture
def jwks() -> Any:
    server = JwksServer()
    try:
        yield server
    finally:
        server.stop()


def test_serve_verifies_dynamic_webhook_jwts_like_the_lambda(tmp_path: Path, jwks: Any) -> None:
    signer = Signer("serve-key")
    jwks.keys = [signer.jwk()]
    db = tmp_path / "ops.db"
    env = {
        "OPSTATE_WEBHOOK_SECRETS": TEST_SECRET,
        "OPSTATE_PUBLIC_URL": AUDIENCE,
        "OPSTATE_JWT_ISSUER": ISSUER,
        "OPSTATE_JWKS_URL": jwks.url,
    }
    server = start_serve(["--store", f"sqlite:///{db}"], cwd=tmp_path, env=env)
    try:
        assert f"dynamic webhooks (JWT): on, audience {AUDIENCE}" in server.output()
        hook = f"{server.url}/gemini/webhook"
        public_host = urlsplit(AUDIENCE).hostname
        assert public_host is not None
        headers = {"Host": public_host, "content-type": "application/json"}
        token = signer.token()
        status, _, answer = http(
            "POST", hook, HOOK, {**headers, "Authorization": f"Bearer {token}"}, token=None
        )
        assert (status, answer["applied"], answer["name"]) == (200, True, "batches/j1")
        wrong_aud = signer.token(aud="https://elsewhere.test/gemini/webhook")
        status, _, _ = http(
            "POST", hook, HOOK, {**headers, "Authorization": f"Bearer {wrong_aud}"}, token=None
        )
        assert status == 401
        # Standard Webhooks deliveries still verify beside it, as in the Lambda.
        signed = signed_headers(HOOK, msg_id=None, timestamp=None)
        assert http("POST", hook, HOOK, {**headers, **signed}, token=None)[0] == 200
        # An unreadable JWT delivery is kept with its token (its proof), nothing else.
        odd = b'{"type":"batch.failed","data":{"id":"a b"}}'
        status, _, answer = http(
            "POST", hook, odd, {**headers, "Authorization": f"Bearer {token}"}, token=None
        )
        assert (status, answer["reason"]) == (200, "quarantined")
        assert server.terminate() == 0
    finally:
        server.kill()

    quarantine = SQLiteQuarantine(db)
    (kept,) = quarantine.entries()
    assert kept.headers == {"authorization": f"Bearer {token}"}
    # Replayed later (its token long expired): verified again without the expiry, against the
    # same audience and JWKS; a token for another audience is refused.
    past = datetime.now(tz=UTC) - timedelta(days=3)
    late = signer.token(iat=past, exp=past + timedelta(minutes=5))
    other = signer.token(
        aud="https://elsewhere.test/hook", iat=past, exp=past + timedelta(minutes=5)
    )
    body = b'{"type":"batch.failed","timestamp":"2026-05-10T09:00:00Z","data":{"id":"batches/j2"}}'
    for i, bearer in enumerate((late, other)):
        quarantine.put(
            Delivery.new(
                body,
                webhook_id=f"jwt-{i}",
                reason="invalid-name",
                message="m",
                received_ns=i + 1,
                proof={"authorization": f"Bearer {bearer}"},
            )
        )
    result = run_cli(
        ["replay", "--quarantine", "--store", f"sqlite:///{db}", "--json"], cwd=tmp_path, env=env
    )
    report = json.loads(result.stdout)
    assert (report["applied"], report["refused"], report["unreadable"]) == (1, 1, 1), report
    got = run_cli(["get", "batches/j2", "--json", "--store", f"sqlite:///{db}"], cwd=tmp_path)
    assert json.loads(got.stdout)["state"] == "FAILED"


def test_the_proof_kept_is_the_verified_one() -> None:
    class Jwt:
        header = "authorization"

    class Both:
        jwt = Jwt()

    hmac_headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": "1",
        "webhook-signature": "v1,x",
        "authorization": "Bearer not-the-proof",
        "cookie": "c",
    }
    assert proof_headers(Both(), hmac_headers) == {  # type: ignore[arg-type]
        "webhook-id": "msg_1",
        "webhook-timestamp": "1",
        "webhook-signature": "v1,x",
    }
    assert proof_headers(Both(), {"authorization": "Bearer t", "cookie": "c"}) == {  # type: ignore[arg-type]
        "authorization": "Bearer t"
    }
