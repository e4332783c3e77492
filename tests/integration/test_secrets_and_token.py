"""Operator flows around secrets, as an operator runs them (the real google-genai client against
the fake Gemini webhooks API, Secrets Manager in moto server, ``opstate serve``):

- issue 18: two overlapping ``rotate`` runs lose nothing (local file and Secrets Manager); a
  rotation prunes only what the rotated webhook stopped listing; a failed ``register`` prints
  a recovery command that names the destination it used;
- issue 12: ``opstate serve`` reads its secret file by the one rule, and its operations routes
  need the API token, which the printed curl example uses.

The overlapping rotations are two ``opstate`` processes, and serve is one; every other command
runs in the test's own process (``tests.support.cli.in_clean_process``, in the test's folder
and with none of the run's store, key or secret settings): what they prove is what the command
wrote and said, and a process each was ~1 CPU s of importing (issue 49).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import stat
import subprocess
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

from opstate.webhook_secrets import parse_stored
from tests.support.cli import Result, in_clean_process
from tests.support.fake_gemini_webhooks import FakeGeminiWebhooks
from tests.support.serve_process import OPSTATE, TEST_API_TOKEN, cli_env, http, run_cli, start_serve
from tests.support.webhooks import sign


def key(seed: bytes) -> str:
    return "whsec_" + base64.b64encode(seed * (32 // len(seed))).decode()


HAND_KEY = key(b"hand-added-key-0")  # 16 bytes x 2


@pytest.fixture
def fake() -> Any:
    server = FakeGeminiWebhooks().start()
    yield server
    server.stop()


def gemini(server: FakeGeminiWebhooks) -> dict[str, str | None]:
    return {"GEMINI_API_KEY": "test-key", "GOOGLE_GEMINI_BASE_URL": server.url}


@pytest.fixture
def secret_arn(moto_server: Any) -> tuple[str, dict[str, str | None]]:
    client = boto3.client("secretsmanager", endpoint_url=moto_server.endpoint)
    arn: str = client.create_secret(Name=f"opstate-webhook-{uuid.uuid4().hex[:8]}")["ARN"]
    return arn, {"AWS_ENDPOINT_URL_SECRETS_MANAGER": moto_server.endpoint}


def sm_client(env: dict[str, str | None]) -> Any:
    return boto3.client("secretsmanager", endpoint_url=env["AWS_ENDPOINT_URL_SECRETS_MANAGER"])


def sm_keys(arn: str, env: dict[str, str | None]) -> list[str]:
    value = sm_client(env).get_secret_value(SecretId=arn)["SecretString"]
    return list(parse_stored(value).keys)


Cli = Callable[[list[str], dict[str, str | None]], Result]


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    plain_http_tls: dict[str, str],
) -> Cli:
    """``opstate ARGS`` in this process, in tmp_path, with ``env`` set: as ``run_cli`` runs it
    (none of the run's store, key or secret settings), without a process of its own. The fakes
    speak plain HTTP: google-genai's clients, here and in the rotate processes (which get this
    environment), load one CA certificate (``tests.support.ca_file``)."""
    for key, value in plain_http_tls.items():
        monkeypatch.setenv(key, value)
    run = in_clean_process(
        monkeypatch, capsys, tmp_path, also=("AWS_ENDPOINT_URL_SECRETS_MANAGER",)
    )

    def one(args: list[str], env: dict[str, str | None]) -> Result:
        return run(*args, env={k: v for k, v in env.items() if v is not None})

    return one


def all_secrets(server: FakeGeminiWebhooks, webhook_id: str) -> set[str]:
    with server.lock:
        return {s for s, _ in server.webhooks[webhook_id].secrets}


def overlapping_rotations(
    server: FakeGeminiWebhooks, args: list[str], cwd: Path, env: dict[str, str | None]
) -> None:
    """Two ``rotate`` runs at once: each has read the store and is inside Gemini's rotate call
    before either writes (the fake holds each rotation until both arrived)."""
    server.rotate_barrier = threading.Barrier(2)
    procs = [
        subprocess.Popen(
            [*OPSTATE, "webhooks", "rotate", *args],
            cwd=cwd,
            env=cli_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
    server.rotate_barrier = None


# --- issue 18 item 1: overlapping rotations ------------------------------------------------------


def test_overlapping_rotations_keep_every_secret_in_the_local_file(
    cli: Cli, fake: FakeGeminiWebhooks, tmp_path: Path
) -> None:
    env = gemini(fake)
    url = "https://tunnel.example.test/gemini/webhook"
    assert cli(["webhooks", "register", "--url", url], env).code == 0
    overlapping_rotations(fake, ["--id", "wh1"], tmp_path, env)
    path = tmp_path / ".opstate" / "webhook-secret"
    stored = set(parse_stored(path.read_bytes()).keys)
    # Gemini holds three valid secrets (the new two and the first, for 24 h): so do we.
    assert stored == all_secrets(fake, "wh1")
    assert len(stored) == 3
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_overlapping_rotations_keep_every_secret_in_secrets_manager(
    cli: Cli,
    fake: FakeGeminiWebhooks,
    tmp_path: Path,
    secret_arn: tuple[str, dict[str, str | None]],
) -> None:
    arn, aws = secret_arn
    env = {**gemini(fake), **aws}
    url = "https://hooks.example.test/gemini/webhook"
    result = cli(["webhooks", "register", "--url", url, "--secret-arn", arn], env)
    assert result.code == 0, result.err
    overlapping_rotations(fake, ["--id", "wh1", "--secret-arn", arn], tmp_path, env)
    stored = sm_keys(arn, env)
    assert set(stored) == all_secrets(fake, "wh1")
    assert len(stored) == 3
    assert not (tmp_path / ".opstate" / "webhook-secret").exists()


# --- issue 18 item 2: prune only what this webhook stopped listing -------------------------------


def test_rotate_keeps_another_projects_and_hand_added_secrets(cli: Cli, tmp_path: Path) -> None:
    project_a, project_b = FakeGeminiWebhooks().start(), FakeGeminiWebhooks().start()
    try:
        url = "https://tunnel.example.test/gemini/webhook"
        for project in (project_a, project_b):
            result = cli(["webhooks", "register", "--url", url], gemini(project))
            assert result.code == 0, result.err
        path = tmp_path / ".opstate" / "webhook-secret"
        path.write_text(path.read_text() + HAND_KEY + "\n")
        a_old = project_a.current_secret("wh1")
        b_key = project_b.current_secret("wh1")

        # Default revocation: the previous key stays valid for 24 h: kept.
        result = cli(["webhooks", "rotate"], gemini(project_a))
        assert result.code == 0, result.err
        a_new = project_a.current_secret("wh1")
        assert parse_stored(path.read_bytes()).keys == (a_new, b_key, a_old, HAND_KEY)

        # Immediate revocation: wh1 listed a_new before and no longer does: dropped (a_old is
        # still honoured for the rest of its 24 h: kept). Project B's key and the key added by
        # hand are not this webhook's to drop.
        result = cli(["webhooks", "rotate", "--revoke-now"], gemini(project_a))
        assert result.code == 0, result.err
        a_newest = project_a.current_secret("wh1")
        stored = parse_stored(path.read_bytes()).keys
        assert stored[0] == a_newest
        assert a_new not in stored
        assert set(stored) == {a_newest, a_old, b_key, HAND_KEY}
    finally:
        project_a.stop()
        project_b.stop()


# --- issue 18 item 3: the recovery hint names the destination used -------------------------------


def test_failed_register_hint_repeats_the_secret_arn(
    cli: Cli,
    fake: FakeGeminiWebhooks,
    tmp_path: Path,
    secret_arn: tuple[str, dict[str, str | None]],
) -> None:
    _, aws = secret_arn
    env = {**gemini(fake), **aws}
    client = sm_client(env)
    name = f"opstate-webhook-{uuid.uuid4().hex[:8]}"  # --secret-arn takes a name too
    client.create_secret(Name=name)
    # The Secrets Manager write fails after Gemini created the webhook (the secret is gone).
    fake.after_create = lambda: client.delete_secret(SecretId=name, ForceDeleteWithoutRecovery=True)
    url = "https://hooks.example.test/gemini/webhook"
    result = cli(["webhooks", "register", "--url", url, "--secret-arn", name], env)
    fake.after_create = None
    assert result.code == 1
    hint = f"opstate webhooks rotate --id wh1 --secret-arn {name}"
    assert hint in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1
    assert fake.current_secret("wh1") not in result.err

    # Following the hint, as printed, stores the new secret in Secrets Manager, not locally.
    client.create_secret(Name=name)
    result = cli(shlex.split(hint)[1:], env)
    assert result.code == 0, result.err
    assert sm_keys(name, env)[0] == fake.current_secret("wh1")
    assert not (tmp_path / ".opstate" / "webhook-secret").exists()


def test_failed_register_hint_repeats_the_secret_file(
    cli: Cli, fake: FakeGeminiWebhooks, tmp_path: Path
) -> None:
    path = tmp_path / "secrets" / "hook-secret"

    def break_the_file() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()  # a directory where the file should go: the write fails

    fake.after_create = break_the_file
    url = "https://tunnel.example.test/gemini/webhook"
    args = ["webhooks", "register", "--url", url, "--secret-file", str(path)]
    result = cli(args, gemini(fake))
    fake.after_create = None
    assert result.code == 1
    assert f"opstate webhooks rotate --id wh1 --secret-file {shlex.quote(str(path))}" in (
        result.err
    ), result.err


def test_rotate_warns_about_ignored_entries_by_position_and_writes_keys_only(
    cli: Cli, fake: FakeGeminiWebhooks, tmp_path: Path
) -> None:
    env = gemini(fake)
    url = "https://tunnel.example.test/gemini/webhook"
    assert cli(["webhooks", "register", "--url", url], env).code == 0
    path = tmp_path / ".opstate" / "webhook-secret"
    first = fake.current_secret("wh1")
    path.write_text(f"# current secret\n{first}\n# rotated 2026-05-10, old one below\nCHANGEME\n")
    result = cli(["webhooks", "rotate"], env)
    assert result.code == 0, result.err
    assert "line 4 is not a webhook secret" in result.err
    assert "CHANGEME" not in result.err + result.out
    assert path.read_text() == f"{fake.current_secret('wh1')}\n{first}\n"


# --- issue 12 items 1 and 6: opstate serve --------------------------------------------------------


def signed_webhook(secret: str, name: str) -> tuple[bytes, dict[str, str]]:
    import time

    body = json.dumps(
        {"type": "batch.succeeded", "timestamp": "2026-05-10T10:00:00Z", "data": {"id": name}}
    ).encode()
    msg_id, ts = f"msg_{uuid.uuid4().hex}", int(time.time())
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": sign(secret, msg_id, ts, body),
    }
    return body, headers


def test_serve_reads_a_commented_secret_file_by_the_one_rule(tmp_path: Path) -> None:
    real = key(b"the-real-local-secret-key-000000")
    path = tmp_path / ".opstate" / "webhook-secret"
    path.parent.mkdir()
    path.write_text(f"# current secret\n{real}\n# rotated 2026-05-10, old one below\nab\n")
    path.chmod(0o600)  # a secret file follows opstate.private_files' rule
    server = start_serve(["--store", "memory://"], cwd=tmp_path)
    try:
        out = server.output()
        assert "line 4 is not a webhook secret" in out
        body, headers = signed_webhook(real, "batches/s-1")
        assert http("POST", f"{server.url}/gemini/webhook", body, headers)[0] == 200
        for word in ("current", "secret", "rotated", "old", "ab"):
            forged = f"whsec_{word}{'=' * (-len(word) % 4)}"
            body, headers = signed_webhook(forged, "batches/s-2")
            assert http("POST", f"{server.url}/gemini/webhook", body, headers)[0] == 401, word
        # The file is rotated to something with no key while serving: 503, never accepted.
        path.write_text("CHANGEME\n")
        os.utime(path, ns=(1, 1))
        body, headers = signed_webhook(real, "batches/s-3")
        assert http("POST", f"{server.url}/gemini/webhook", body, headers)[0] == 503
        assert server.terminate() == 0
    finally:
        server.kill()


def test_serve_refuses_to_start_without_a_usable_key(tmp_path: Path) -> None:
    result = run_cli(
        ["serve", "--port", "0", "--store", "memory://"],
        cwd=tmp_path,
        env={"OPSTATE_WEBHOOK_SECRETS": "placeholder CHANGEME"},
    )
    assert result.returncode == 1
    assert "holds no usable key" in result.stderr
    assert "placeholder" not in result.stderr


def test_serve_operations_need_the_api_token(tmp_path: Path) -> None:
    server = start_serve(["--store", "memory://"], cwd=tmp_path)
    try:
        url = f"{server.url}/operations/batches/t-1"
        for token in (None, "", "wrong-token", TEST_API_TOKEN + "x"):
            status, headers, answer = http("PUT", url, token=token)
            assert (status, answer["error"]) == (401, "unauthorized"), token
            lowered = {k.lower(): v for k, v in headers.items()}
            assert lowered["www-authenticate"].startswith("Bearer")
            assert http("GET", url, token=token)[0] == 401
        assert http("PUT", url)[0] == 200
        assert http("GET", url)[0] == 200
        assert "from OPSTATE_API_TOKEN" in server.output()
        assert TEST_API_TOKEN not in server.output()
        assert f"operations page: {server.url}/\n" in server.output()
        assert "paste the value of OPSTATE_API_TOKEN" in server.output()
        assert server.terminate() == 0
    finally:
        server.kill()


def test_serve_generates_the_token_file_and_its_curl_example_works(tmp_path: Path) -> None:
    env: dict[str, str | None] = {"OPSTATE_API_TOKEN": None}
    server = start_serve(["--store", "memory://"], cwd=tmp_path, env=env)
    try:
        token_file = tmp_path / ".opstate" / "api-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32
        out = server.output()
        assert f"generated, saved in {token_file}" in out
        # Printed once, in the page link's fragment (as notebook servers do), nowhere else.
        assert [x for x in out.splitlines() if token in x] == [
            f"operations page: {server.url}/#token={token}"
        ]
        assert http("PUT", f"{server.url}/operations/batches/t-2", token=None)[0] == 401
        if shutil.which("curl") and shutil.which("bash"):
            line = next(x for x in out.splitlines() if x.startswith("track a job: "))
            command = line.removeprefix("track a job: ").replace("<id>", "t-2")
            result = subprocess.run(
                ["bash", "-c", command], capture_output=True, text=True, timeout=20, cwd=tmp_path
            )
            assert result.returncode == 0, result.stderr
            assert json.loads(result.stdout)["state"] == "PENDING"
        else:
            assert http("PUT", f"{server.url}/operations/batches/t-2", token=token)[0] == 200
        assert server.terminate() == 0
    finally:
        server.kill()
    again = start_serve(["--store", "memory://"], cwd=tmp_path, env=env)
    try:
        assert token_file.read_text().strip() == token  # reused
        assert f"from {token_file}" in again.output()
        assert f"operations page: {again.url}/#token={token}" in again.output()
        assert http("GET", f"{again.url}/operations/batches/x", token=token)[0] == 404
        assert again.terminate() == 0
    finally:
        again.kill()
