"""``POST /google-cloud/pubsub`` through the real webhook Lambda entry (functions/webhook/app.py):
Pub/Sub push envelopes whose OIDC tokens are signed by a test key published in a test JWKS."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from opstate import api as api_module
from opstate.config import settings
from opstate.domain.routes import PUBSUB_PATH
from opstate.local.apigw import LocalLambdaContext
from opstate.store.sqlite import SQLiteStore
from tests.integration.test_api_events import load_entry
from tests.support.fake_google_cloud import cloud_video_response
from tests.support.webhooks import TEST_SECRET, http_event
from tests.unit.test_signatures import JwksServer, Signer

AUDIENCE = "https://abc123.execute-api.us-east-1.amazonaws.com/google-cloud/pubsub"
EMAIL = "veo-push@p1.iam.gserviceaccount.com"
GOOGLE = "https://accounts.google.com"
VEO = (
    "projects/p1/locations/us-central1/publishers/google/models/veo-3.0-generate-001/operations/op7"
)


@pytest.fixture
def signer() -> Signer:
    return Signer("google-key-1")


@pytest.fixture
def jwks(signer: Signer) -> Iterator[JwksServer]:
    server = JwksServer()
    server.keys = [signer.jwk()]
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ops.db"


def configure(monkeypatch: pytest.MonkeyPatch, db: Path, **extra: str) -> Any:
    monkeypatch.setenv("OPSTATE_STORE", f"sqlite:///{db}")
    monkeypatch.setenv("OPSTATE_WEBHOOK_SECRETS", TEST_SECRET)
    for key, value in extra.items():
        monkeypatch.setenv(key, value)
    settings.cache_clear()
    api_module.reset_default_app()
    return load_entry().lambda_handler


@pytest.fixture
def handler(monkeypatch: pytest.MonkeyPatch, jwks: JwksServer, db: Path) -> Iterator[Any]:
    yield configure(
        monkeypatch,
        db,
        OPSTATE_PUBSUB_AUDIENCE=AUDIENCE,
        OPSTATE_PUBSUB_EMAIL=EMAIL,
        OPSTATE_PUBSUB_JWKS_URL=jwks.url,
    )
    api_module.reset_default_app()
    settings.cache_clear()


def token(signer: Signer, **claims: Any) -> str:
    base: dict[str, Any] = {
        "aud": AUDIENCE,
        "iss": GOOGLE,
        "email": EMAIL,
        "email_verified": True,
        "sub": "1234567890",
    }
    return signer.token(**{**base, **claims})


def envelope(data: bytes, message_id: str = "m1") -> bytes:
    return json.dumps(
        {
            "message": {
                "data": base64.b64encode(data).decode(),
                "attributes": {"source": "veo"},
                "messageId": message_id,
                "publishTime": "2026-05-01T10:00:00.123Z",
            },
            "subscription": "projects/p1/subscriptions/opstate-push",
        }
    ).encode()


def operation(**fields: Any) -> bytes:
    return json.dumps({"name": VEO, **fields}).encode()


def push(handler: Any, body: bytes, bearer: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json"}
    if bearer is not None:
        headers["authorization"] = f"Bearer {bearer}"
    response = handler(
        http_event("POST", PUBSUB_PATH, body=body, headers=headers), LocalLambdaContext()
    )
    return response["statusCode"], json.loads(response["body"])


def records(db: Path) -> list[Any]:
    if not db.exists():
        return []
    store = SQLiteStore(str(db))
    try:
        return list(store.iter_all())
    finally:
        store.close()


def test_a_signed_push_follows_a_veo_cloud_operation_to_succeeded(
    handler: Any, signer: Signer, db: Path
) -> None:
    status, body = push(handler, envelope(operation()), token(signer))
    assert (status, body["applied"], body["state"]) == (200, True, "RUNNING")
    done = operation(done=True, response=cloud_video_response("gs://v/op7.mp4"))
    status, body = push(handler, envelope(done, "m2"), token(signer))
    assert (status, body["applied"], body["state"]) == (200, True, "SUCCEEDED")
    # Pub/Sub redelivers at least once: the same message again changes nothing.
    status, body = push(handler, envelope(done, "m2"), token(signer))
    assert (status, body["applied"]) == (200, False)
    [stored] = records(db)
    assert (stored.name, str(stored.state), str(stored.kind), stored.source) == (
        VEO,
        "SUCCEEDED",
        "video",
        "webhook",
    )
    assert stored.details["video_uri"] == "gs://v/op7.mp4"
    assert stored.version == 2


def expired(signer: Signer) -> str:
    past = datetime.now(UTC) - timedelta(hours=2)
    return token(signer, iat=past, exp=past + timedelta(minutes=5))


def long_lived(signer: Signer) -> str:
    now = datetime.now(UTC)
    return token(signer, iat=now, exp=now + timedelta(days=2))


REFUSED: dict[str, Callable[[Signer], str | None]] = {
    "no token": lambda s: None,
    "wrong audience": lambda s: token(s, aud="https://elsewhere.example/push"),
    "wrong issuer": lambda s: token(s, iss="https://accounts.example.test"),
    "another service account": lambda s: token(s, email="someone@p2.iam.gserviceaccount.com"),
    "email not verified": lambda s: token(s, email_verified=False),
    "no email": lambda s: token(s, email=None),
    "expired": expired,
    "lives too long": long_lived,
    "unknown key": lambda s: Signer("google-key-1").token(
        aud=AUDIENCE, iss=GOOGLE, email=EMAIL, email_verified=True
    ),
    "not a jwt": lambda s: "ya29.an-access-token",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_push_whose_token_fails_any_rule_is_refused_and_writes_nothing(
    handler: Any, signer: Signer, db: Path, case: str
) -> None:
    status, body = push(handler, envelope(operation(done=True)), REFUSED[case](signer))
    assert (status, body["error"]) == (401, "invalid-signature")
    assert records(db) == []


UNREADABLE = {
    "not json": b"{not json",
    "no message": json.dumps({"subscription": "s"}).encode(),
    "data not base64": json.dumps({"message": {"data": "%%%", "messageId": "m"}}).encode(),
    "data not json": envelope(b"progress: 50%"),
    "data a list": envelope(b"[1, 2]"),
    "a gemini api name": envelope(json.dumps({"name": "models/veo-3/operations/x"}).encode()),
    "a cloud batch job": envelope(
        json.dumps({"name": "projects/p1/locations/l/batchPredictionJobs/1"}).encode()
    ),
    "no name": envelope(json.dumps({"done": True}).encode()),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_a_signed_push_that_cannot_be_read_is_quarantined_and_acknowledged(
    handler: Any, signer: Signer, db: Path, case: str
) -> None:
    status, body = push(handler, UNREADABLE[case], token(signer))
    assert (status, body["applied"], body["reason"]) == (200, False, "quarantined")
    assert records(db) == []


def test_without_pubsub_configuration_every_push_is_refused(
    monkeypatch: pytest.MonkeyPatch, jwks: JwksServer, signer: Signer, db: Path
) -> None:
    monkeypatch.delenv("OPSTATE_PUBSUB_AUDIENCE", raising=False)
    monkeypatch.delenv("OPSTATE_PUBSUB_EMAIL", raising=False)
    handler = configure(monkeypatch, db, OPSTATE_PUBSUB_JWKS_URL=jwks.url)
    try:
        status, _ = push(handler, envelope(operation(done=True)), token(signer))
    finally:
        api_module.reset_default_app()
        settings.cache_clear()
    assert status == 401
    assert records(db) == []
