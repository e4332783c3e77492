"""Issue 24 section 1: the quarantine must not be a way in, nor a way to fill the disk.

- a kept delivery is applied on replay only if its kept signature headers verify again (without
  the timestamp tolerance); a hand-written message in the queue is refused and reported;
- replay parses with ``strict_json`` (``1e400`` is not applied on replay either);
- one entry per ``webhook-id``; the local quarantine is bounded (count and bytes), and when it is
  full a signed delivery it would keep is answered 503 (Gemini retries) and counted;
- ``replay --limit N`` walks past what stays kept, so every readable delivery is reached;
- a quarantine table written by the previous release keeps working.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from opstate.api import create_app
from opstate.config import (
    DEFAULT_QUARANTINE_MAX_BYTES,
    DEFAULT_QUARANTINE_MAX_ENTRIES,
    ConfigError,
    Settings,
)
from opstate.domain.model import Reason
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.quarantine import (
    Bounds,
    Delivery,
    MemoryQuarantine,
    Quarantine,
    QuarantineFullError,
    SQLiteQuarantine,
    SqsQuarantine,
)
from opstate.replay import replay
from opstate.signatures import StaticSecretsVerifier
from opstate.store import MemoryStore
from tests.support.stores import QUARANTINE_KINDS, quarantine_for
from tests.support.webhooks import (
    EVENT_TIMESTAMP,
    OTHER_SECRET,
    TEST_SECRET,
    http_event,
    signed_headers,
)

NOW_NS = parse_time("2026-05-10T10:00:00Z")
VERIFIER = StaticSecretsVerifier((TEST_SECRET,), tolerance_s=None)


def body_of(event_type: str, name: str, ts: str = "2026-05-10T09:00:00Z") -> bytes:
    return json.dumps({"type": event_type, "timestamp": ts, "data": {"id": name}}).encode()


def genuine(raw: bytes, i: int = 0, *, reason: str = "invalid-name") -> Delivery:
    msg_id = f"msg_{i}_{uuid.uuid4().hex[:8]}"
    return Delivery.new(
        raw,
        webhook_id=msg_id,
        reason=reason,
        message="m",
        received_ns=NOW_NS + i,
        proof=signed_headers(raw, msg_id=msg_id),
    )


@pytest.fixture(params=QUARANTINE_KINDS)
def quarantine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Quarantine]:
    with quarantine_for(request.param, tmp_path) as made:
        yield made


# -- integrity ------------------------------------------------------------------------------


def test_a_hand_written_message_in_the_queue_is_refused_and_the_genuine_delivery_wins() -> None:
    from moto import mock_aws

    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="quarantine")["QueueUrl"]
        q = SqsQuarantine(url, client=sqs, visibility_timeout_s=0)
        forged = body_of("batch.cancelled", "batches/b1", ts="9999-12-31T23:59:58Z")
        real = body_of("batch.succeeded", "batches/b1")
        # 1. what the attacker of the issue wrote: only sqs:SendMessage needed, no signature.
        unsigned = {
            "v": 1,
            "id": "attacker",
            "webhookId": "msg_x",
            "receivedNs": 1,
            "reason": "invalid-name",
            "message": "m",
            "body": base64.b64encode(forged).decode(),
        }
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps(unsigned))
        # 2. a genuine delivery's headers on another body; 3. signed with a key not ours.
        copied = Delivery.new(
            forged,
            webhook_id="msg_y",
            reason="invalid-name",
            message="m",
            received_ns=2,
            proof=signed_headers(real, msg_id="msg_y"),
        )
        other = Delivery.new(
            forged,
            webhook_id="msg_z",
            reason="invalid-name",
            message="m",
            received_ns=3,
            proof=signed_headers(forged, msg_id="msg_z", secrets=(OTHER_SECRET,)),
        )
        for d in (copied, other):
            sqs.send_message(QueueUrl=url, MessageBody=d.to_json())
        q.put(genuine(real, 4))

        store = MemoryStore()
        result = replay(q, store, verifier=VERIFIER, clock_ns=lambda: NOW_NS)
        assert (result.taken, result.refused, result.applied) == (4, 3, 1)
        assert sorted(c for _, c, _ in result.problems) == [
            "invalid-signature",
            "invalid-signature",
            "unverified",
        ]
        record = store.get("batches/b1")
        assert record is not None and record.state is State.SUCCEEDED
        assert record.source == "webhook"
        # The refused messages are left for an operator (hidden for a while, not deleted).
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
        assert attributes["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "3"


def test_the_timestamp_tolerance_does_not_apply_on_replay() -> None:
    q, store = MemoryQuarantine(), MemoryStore()
    q.put(genuine(body_of("batch.failed", "batches/b2")))  # signed at EVENT_TIMESTAMP, long ago
    live = StaticSecretsVerifier((TEST_SECRET,))  # the live verifier's 300 s against now
    assert replay(q, store, verifier=live).refused == 1
    assert replay(q, store, verifier=VERIFIER).applied == 1


def test_replay_parses_strict_json_as_the_live_path_does() -> None:
    q, store = MemoryQuarantine(), MemoryStore()
    for raw in (
        b'{"type":"batch.succeeded","timestamp":"2026-05-10T09:00:00Z",'
        b'"data":{"id":"batches/big","user_metadata":{"n":1e400}}}',
        b'{"type":"batch.succeeded","timestamp":"2026-05-10T09:00:00Z",'
        b'"data":{"id":"batches/nan","user_metadata":{"n":NaN}}}',
    ):
        q.put(genuine(raw, reason="malformed-json"))
    result = replay(q, store, verifier=VERIFIER, clock_ns=lambda: NOW_NS)
    assert (result.unreadable, result.applied) == (2, 0)
    assert {c for _, c, _ in result.problems} == {"malformed-json"}
    assert store.all() == []


# -- one entry per webhook-id, bounds -------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite"])  # SQS: its own limits bound it
def test_one_entry_per_webhook_id(kind: str, tmp_path: Path) -> None:
    quarantine: Quarantine = (
        MemoryQuarantine() if kind == "memory" else SQLiteQuarantine(tmp_path / "q.db")
    )
    first = genuine(b"{", 0)
    kept_id = quarantine.put(first)
    for _ in range(60):
        again = Delivery.new(
            b"{", webhook_id=first.webhook_id, reason="r", message="m", received_ns=NOW_NS
        )
        assert quarantine.put(again) == kept_id
    assert [d.id for d in quarantine.entries()] == [first.id]


def test_the_local_quarantine_is_bounded_by_count_and_bytes(tmp_path: Path) -> None:
    by_count = SQLiteQuarantine(tmp_path / "a.db", bounds=Bounds(max_entries=3, max_bytes=10**9))
    for i in range(3):
        by_count.put(genuine(b"{", i))
    with pytest.raises(QuarantineFullError, match="OPSTATE_QUARANTINE_MAX_ENTRIES"):
        by_count.put(genuine(b"{", 9))
    by_bytes = SQLiteQuarantine(tmp_path / "b.db", bounds=Bounds(max_entries=99, max_bytes=1000))
    by_bytes.put(genuine(b"{" * 600, 0))
    with pytest.raises(QuarantineFullError, match="OPSTATE_QUARANTINE_MAX_BYTES"):
        by_bytes.put(genuine(b"{" * 600, 1))
    assert by_bytes.count() == 1
    by_bytes.put(genuine(b"{" * 300, 2))  # what still fits is kept


def test_quarantine_bounds_are_settings_with_defaults() -> None:
    assert Settings.from_env({}).quarantine_max_entries == DEFAULT_QUARANTINE_MAX_ENTRIES
    assert Settings.from_env({}).quarantine_max_bytes == DEFAULT_QUARANTINE_MAX_BYTES
    given = Settings.from_env(
        {"OPSTATE_QUARANTINE_MAX_ENTRIES": "5", "OPSTATE_QUARANTINE_MAX_BYTES": "4096"}
    )
    assert (given.quarantine_max_entries, given.quarantine_max_bytes) == (5, 4096)
    with pytest.raises(ConfigError, match="OPSTATE_QUARANTINE_MAX_ENTRIES"):
        Settings.from_env({"OPSTATE_QUARANTINE_MAX_ENTRIES": "0"})


def _app(quarantine: Quarantine) -> Any:
    return create_app(
        store=MemoryStore(),
        verifier=StaticSecretsVerifier([TEST_SECRET], clock_s=lambda: EVENT_TIMESTAMP),
        settings=Settings(),
        clock_ns=lambda: NOW_NS,
        quarantine=quarantine,
    )


def _post(app: Any, raw: bytes, msg_id: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    headers = signed_headers(raw, msg_id=msg_id)
    response = app.resolve(http_event("POST", "/gemini/webhook", body=raw, headers=headers), None)
    return response["statusCode"], json.loads(response["body"]), response.get("headers") or {}


def test_a_resent_delivery_is_one_entry_and_a_full_quarantine_answers_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[str] = []
    monkeypatch.setattr("opstate.api.webhook.count", lambda name, *a, **k: counted.append(name))
    q = SQLiteQuarantine(tmp_path / "q.db", bounds=Bounds(max_entries=2, max_bytes=10**9))
    app = _app(q)
    unreadable = b"{" * 1000
    answers = {_post(app, unreadable, "msg_same")[1]["quarantineId"] for _ in range(60)}
    assert len(answers) == 1 and q.count() == 1
    assert _post(app, unreadable, "msg_other")[0] == 200
    status, answer, headers = _post(app, unreadable, "msg_third")
    assert (status, answer["error"]) == (503, "unavailable")
    assert "Retry-After" in headers or "retry-after" in headers
    assert "QuarantineFull" in counted and q.count() == 2
    # A resent delivery kept already is still answered 200 (no new entry needed).
    assert _post(app, unreadable, "msg_same")[0] == 200


def test_two_long_webhook_ids_sharing_a_prefix_are_two_entries(tmp_path: Path) -> None:
    q = SQLiteQuarantine(tmp_path / "q.db")
    app = _app(q)
    prefix = "msg_" + "p" * 196  # the logs clip ids to 128 characters; the quarantine must not
    first = _post(app, b"{", prefix + "-one")[1]["quarantineId"]
    second = _post(app, b"{", prefix + "-two")[1]["quarantineId"]
    assert first != second and q.count() == 2
    assert {d.webhook_id for d in q.entries()} == {prefix + "-one", prefix + "-two"}


# -- walking past what stays kept -----------------------------------------------------------


def test_replay_with_a_limit_walks_past_what_is_still_unreadable(quarantine: Quarantine) -> None:
    for i in range(12):
        quarantine.put(genuine(b'{"type":"batch.succeeded","data":{"id":"a b"}}', i))
    quarantine.put(genuine(body_of("batch.succeeded", "batches/behind"), 99))
    store = MemoryStore()
    first = replay(quarantine, store, verifier=VERIFIER, limit=5, clock_ns=lambda: NOW_NS)
    assert (first.taken, first.unreadable, first.applied) == (5, 5, 0)
    reached = [first]
    for _ in range(3):
        reached.append(replay(quarantine, store, verifier=VERIFIER, limit=5))
        if store.get("batches/behind") is not None:
            break
    record = store.get("batches/behind")
    assert record is not None and record.state is State.SUCCEEDED
    assert len(reached) <= 3  # 12 unreadable ahead of it, 5 a run: the third run reaches it
    assert sum(r.applied for r in reached) == 1
    if not isinstance(quarantine, SqsQuarantine):  # SQS: walked-past messages stay hidden
        assert len(quarantine.entries()) == 12


# -- the previous release's table -------------------------------------------------------------


def test_a_quarantine_table_the_previous_release_wrote_keeps_working(tmp_path: Path) -> None:
    path = tmp_path / "ops.db"
    old = [
        Delivery.new(
            b"{", webhook_id="msg_dup", reason="malformed-json", message="m", received_ns=1
        ),
        Delivery.new(
            b"[", webhook_id="msg_dup", reason="malformed-json", message="m", received_ns=2
        ),
        Delivery.new(b"x", webhook_id=None, reason="malformed-json", message="m", received_ns=3),
    ]
    with sqlite3.connect(path) as conn:  # the schema and messages as the first release wrote
        conn.execute(
            "CREATE TABLE quarantine (id TEXT PRIMARY KEY, received_ns TEXT NOT NULL, "
            "message TEXT NOT NULL)"
        )
        for d in old:
            message = json.loads(d.to_json())
            message.pop("headers")
            conn.execute(
                "INSERT INTO quarantine VALUES (?, ?, ?)",
                (d.id, f"{d.received_ns:021d}", json.dumps(message)),
            )
    q = SQLiteQuarantine(path)
    assert [d.id for d in q.entries()] == [d.id for d in old]
    assert all(d.proof == () for d in q.entries())
    assert (
        q.put(Delivery.new(b"{", webhook_id="msg_dup", reason="r", message="m", received_ns=4))
        == old[0].id
    )
    result = replay(q, MemoryStore(), verifier=VERIFIER)
    assert (result.refused, result.applied) == (3, 0)
    assert q.count() == 3
    assert SQLiteQuarantine(path).count() == 3  # opening it again changes nothing


def test_replay_decisions_are_the_reducers(quarantine: Quarantine) -> None:
    raw = body_of("batch.succeeded", "batches/twice")
    quarantine.put(genuine(raw, 0))
    quarantine.put(genuine(raw, 1))  # a second webhook-id for the same event
    result = replay(quarantine, MemoryStore(), verifier=VERIFIER, clock_ns=lambda: NOW_NS)
    assert sorted(d.reason for d in result.decisions) == sorted(
        [Reason.CREATED, Reason.STALE_OR_EQUAL_UPDATE_TIME]
    )
    assert quarantine.entries() == []


# -- opstate quarantine list ----------------------------------------------------------------


def test_quarantine_list_shows_what_is_kept_never_the_body_unless_asked(tmp_path: Path) -> None:
    from tests.support.serve_process import run_cli

    db = tmp_path / "ops.db"
    q = SQLiteQuarantine(db)
    secret_body = b'{"type":"batch.succeeded","data":{"id":"a b"},"secret":"do-not-print"}'
    kept = genuine(secret_body, 0)
    q.put(kept)
    sneaky = Delivery.new(
        b"{",
        webhook_id="msg_\x1b[2J\x1b]0;owned\x07",
        reason="malformed-json",
        message="m",
        received_ns=NOW_NS + 5,
    )
    q.put(sneaky)
    args = ["quarantine", "list", "--store", f"sqlite:///{db}"]
    listed = run_cli([*args, "--json"], cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert doc["quarantine"] == str(db)
    first = doc["deliveries"][0]
    assert first == {
        "id": kept.id,
        "webhookId": kept.webhook_id,
        "received": "2026-05-10T10:00:00.000000000Z",
        "reason": "invalid-name",
        "bytes": len(secret_body),
        "signed": True,
    }
    assert "do-not-print" not in listed.stdout
    text = run_cli(args, cwd=tmp_path)
    assert text.returncode == 0 and "do-not-print" not in text.stdout
    assert "\x1b" not in text.stdout and "\x07" not in text.stdout
    assert "msg_\\x1b[2J\\x1b]0;owned\\x07" in text.stdout
    assert f"{kept.id}  2026-05-10T10:00:00.000000000Z  invalid-name  {len(secret_body)} bytes" in (
        text.stdout
    )
    with_body = json.loads(run_cli([*args, "--json", "--body"], cwd=tmp_path).stdout)
    assert base64.b64decode(with_body["deliveries"][0]["body"]) == secret_body
    assert "do-not-print" in run_cli([*args, "--body"], cwd=tmp_path).stdout


def test_documented_quarantine_shapes_are_what_the_commands_print(tmp_path: Path) -> None:
    from tests.integration.test_cli_operator import documented_shapes, keys, same_shape
    from tests.support.serve_process import run_cli

    shapes = documented_shapes()
    db = tmp_path / "ops.db"
    q = SQLiteQuarantine(db)
    q.put(genuine(b'{"type":"batch.succeeded","data":{"id":"a b"}}', 0))
    q.put(Delivery.new(b"{", webhook_id="msg_v0", reason="r", message="m", received_ns=1))
    store = ["--store", f"sqlite:///{db}"]
    listed = run_cli(["quarantine", "list", *store, "--json"], cwd=tmp_path)
    assert same_shape(keys(shapes["quarantine-list"]), keys(json.loads(listed.stdout)))
    replayed = run_cli(
        ["replay", "--quarantine", *store, "--json"],
        cwd=tmp_path,
        env={"OPSTATE_WEBHOOK_SECRETS": TEST_SECRET},
    )
    assert replayed.returncode == 1
    doc = json.loads(replayed.stdout)
    assert same_shape(keys(shapes["replay-quarantine"]), keys(doc)), doc
    assert (doc["refused"], doc["unreadable"]) == (1, 1)
    nothing = run_cli(["replay", "--quarantine", *store], cwd=tmp_path)
    assert nothing.returncode == 1 and "no webhook secret to verify" in nothing.stderr
    assert SQLiteQuarantine(db).count() == 2


def test_the_log_quarantine_never_logs_the_proof() -> None:
    import io
    import logging

    from opstate.observability import SERVICE, logger
    from opstate.quarantine import LogQuarantine

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logger.registered_formatter)
    std = logging.getLogger(SERVICE)
    std.addHandler(handler)
    kept = genuine(b"{ kept in the log")
    try:
        LogQuarantine().put(kept)
    finally:
        std.removeHandler(handler)
    out = stream.getvalue()
    assert "eyBrZXB0IGluIHRoZSBsb2c=" in out  # the body, base64: recoverable
    assert kept.headers["webhook-signature"].split(",", 1)[1] not in out
