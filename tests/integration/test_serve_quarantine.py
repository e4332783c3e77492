"""``opstate serve`` keeps signed webhooks it cannot read, ``opstate replay --quarantine``
re-ingests them, and a response can always be encoded (a subprocess, as users run it)."""

from __future__ import annotations

import base64
import json
import sqlite3
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.quarantine import Delivery, SQLiteQuarantine
from opstate.store.sqlite import SQLiteStore
from tests.support.serve_process import http, run_cli, start_serve

SECRET = "whsec_" + base64.b64encode(b"opstate-serve-test-secret-32byte").decode()


def signed(raw: bytes) -> dict[str, str]:
    msg_id = f"msg_{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(msg_id, now, raw.decode()),
    }


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "db" / "ops.db"


def test_unreadable_signed_webhooks_are_kept_and_replayed(tmp_path: Path, db: Path) -> None:
    store_url = f"sqlite:///{db}"
    server = start_serve(
        ["--store", store_url], cwd=tmp_path, env={"OPSTATE_WEBHOOK_SECRETS": SECRET}
    )
    try:
        unreadable = b'{"type":"batch.succeeded","data":{"id":"batches/a b"}}'
        status, _, answer = http(
            "POST", f"{server.url}/gemini/webhook", unreadable, signed(unreadable)
        )
        assert (status, answer["reason"], answer["error"]) == (200, "quarantined", "invalid-name")
        bare = b'{"type":"video.generated","timestamp":"2026-05-10T10:00:00Z","data":{"id":"v9"}}'
        status, _, answer = http("POST", f"{server.url}/gemini/webhook", bare, signed(bare))
        assert (status, answer["applied"], answer["name"]) == (200, True, "models/-/operations/v9")
    finally:
        assert server.terminate() == 0

    # A signed delivery kept while the normaliser could not read it, readable today; and one
    # an older release kept without its signature headers: it cannot be verified, so it is
    # refused (reported, left kept), never applied.
    quarantine = SQLiteQuarantine(db)
    old = b'{"type":"batch.failed","timestamp":"2026-05-10T09:00:00Z","data":{"id":"b7"}}'
    quarantine.put(
        Delivery.new(
            old,
            webhook_id="msg_old",
            reason="invalid-name",
            message="m",
            received_ns=1,
            proof=signed(old),
        )
    )
    legacy = b'{"type":"batch.cancelled","timestamp":"2026-05-10T09:00:00Z","data":{"id":"b8"}}'
    quarantine.put(
        Delivery.new(legacy, webhook_id="msg_v0", reason="invalid-name", message="m", received_ns=2)
    )
    assert quarantine.count() == 3

    args = ["replay", "--quarantine", "--store", store_url, "--json"]
    env = {"OPSTATE_WEBHOOK_SECRETS": SECRET}
    dry = run_cli([*args, "--dry-run"], cwd=tmp_path, env=env)
    report = json.loads(dry.stdout)
    assert (report["taken"], report["applied"], report["unreadable"], report["refused"]) == (
        3,
        1,
        1,
        1,
    )
    assert quarantine.count() == 3

    done = run_cli(args, cwd=tmp_path, env=env)
    assert done.returncode == 1  # one delivery is still unreadable, one refused: both stay
    report = json.loads(done.stdout)
    assert (report["applied"], report["unreadable"], report["refused"]) == (1, 1, 1)
    assert {p["error"] for p in report["problems"]} == {"invalid-name", "unverified"}
    assert quarantine.count() == 2
    got = run_cli(["get", "batches/b7", "--json", "--store", store_url], cwd=tmp_path)
    assert json.loads(got.stdout)["state"] == "FAILED"
    missing = run_cli(["get", "batches/b8", "--json", "--store", store_url], cwd=tmp_path)
    assert missing.returncode != 0

    usage = run_cli(["replay", "--store", store_url], cwd=tmp_path)
    assert usage.returncode == 2 and "--quarantine" in usage.stderr


def test_a_lone_surrogate_stored_by_an_older_release_never_breaks_a_response(
    tmp_path: Path, db: Path
) -> None:
    db.parent.mkdir(parents=True)
    store = SQLiteStore(db)
    record = OpRecord(
        "batches/s1", State.RUNNING, parse_time("2026-05-10T09:00:00Z"), 1, "report", {}
    )
    store.put_if_absent(record)
    store.close()
    # What the previous release wrote for details {"note": "a\ud800b"} (json.dumps escapes it).
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE operations SET details = ? WHERE name = ?",
            (json.dumps({"note": "a\ud800b"}), "batches/s1"),
        )
    server = start_serve(
        ["--store", f"sqlite:///{db}"], cwd=tmp_path, env={"OPSTATE_WEBHOOK_SECRETS": SECRET}
    )
    try:
        status, _, answer = http("GET", f"{server.url}/operations/batches/s1")
        assert status == 200 and answer["details"] == {"note": "a\ud800b"}
        # A report carrying one is refused: it can never be stored again.
        body = b'{"state":"RUNNING","details":{"note":"\\ud800"}}'
        status, _, answer = http("PUT", f"{server.url}/operations/batches/s1", body)
        assert (status, answer["error"]) == (400, "invalid-details")
        assert "lone surrogate" in answer["message"]
    finally:
        assert server.terminate() == 0
