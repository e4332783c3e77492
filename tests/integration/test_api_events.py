"""The sample events under events/, through the real Lambda entry (functions/webhook/app.py).

The signed events carry a fixed ``webhook-timestamp``; here the Lambda path is configured with a
huge ``OPSTATE_WEBHOOK_TOLERANCE_SECONDS`` (what events/README.md tells ``sam local invoke``
users to do). test_api.py covers the other way: a verifier with a frozen clock.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest

from opstate import api as api_module
from opstate.config import Settings, settings
from opstate.local.apigw import LocalLambdaContext
from opstate.signatures import StaticSecretsVerifier
from opstate.store import MemoryStore
from tests.support.motoserver import MotoServer
from tests.support.template import create_table_from_template
from tests.support.webhooks import (
    EVENT_TIMESTAMP,
    EVENTS_DIR,
    SAMPLE_NAME,
    TEST_SECRET,
    load_event,
    render,
    sample_events,
)

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "functions" / "webhook" / "app.py"
LAYER = ROOT / "layers" / "opstate"


def load_entry() -> ModuleType:
    spec = importlib.util.spec_from_file_location("webhook_entry_under_test", ENTRY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def lambda_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("OPSTATE_WEBHOOK_SECRETS", TEST_SECRET)
    monkeypatch.setenv("OPSTATE_WEBHOOK_TOLERANCE_SECONDS", "2000000000")
    monkeypatch.delenv("OPSTATE_WEBHOOK_SECRET_ARN", raising=False)
    monkeypatch.delenv("OPSTATE_PUBLIC_URL", raising=False)
    settings.cache_clear()
    api_module.reset_default_app()
    yield
    api_module.reset_default_app()
    settings.cache_clear()


def invoke(handler: Any, file_name: str) -> tuple[int, dict[str, Any]]:
    response = handler(load_event(file_name), LocalLambdaContext())
    return response["statusCode"], json.loads(response["body"])


def run_event_story(handler: Any) -> None:
    # The validly signed batch.succeeded creates the record.
    status, body = invoke(handler, "webhook-batch-succeeded.json")
    assert (status, body["applied"], body["reason"]) == (200, True, "created")
    assert (body["name"], body["state"], body["version"]) == (SAMPLE_NAME, "SUCCEEDED", 1)
    # Its base64 twin is a redelivery: dropped, still acknowledged.
    status, body = invoke(handler, "webhook-batch-succeeded-base64.json")
    assert (status, body["applied"], body["reason"]) == (200, False, "stale-or-equal-update-time")
    # The stale RUNNING report never rolls the finished job back.
    status, body = invoke(handler, "report-stale.json")
    assert (status, body["applied"], body["reason"]) == (200, False, "regress-from-terminal")
    assert (body["state"], body["version"]) == ("SUCCEEDED", 1)
    # The refusals.
    status, body = invoke(handler, "webhook-bad-signature.json")
    assert (status, body) == (401, {"error": "invalid-signature", "message": "invalid signature"})
    status, body = invoke(handler, "webhook-oversized.json")
    assert (status, body["error"]) == (413, "payload-too-large")
    # Signed but unreadable: kept in the quarantine, never refused (Gemini would retry it for
    # a day, then disable the endpoint).
    status, body = invoke(handler, "webhook-malformed-json.json")
    assert (status, body["reason"], body["error"]) == (200, "quarantined", "malformed-json")
    # Track a job, then read the finished one back.
    status, body = invoke(handler, "report-track.json")
    assert (status, body["state"], body["reason"]) == (200, "PENDING", "created")
    status, record = invoke(handler, "get-operation.json")
    assert status == 200
    assert record["name"] == SAMPLE_NAME
    assert record["state"] == "SUCCEEDED"
    assert record["updateTime"] == "2026-05-10T09:59:58.123456789Z"
    assert record["details"]["output_file_uri"] == "files/opstate-sample-1-output"


def test_event_files_on_sqlite_through_the_lambda_entry(
    lambda_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OPSTATE_STORE", f"sqlite:///{tmp_path}/ops.db")
    run_event_story(load_entry().lambda_handler)


def test_event_files_on_dynamodb_through_the_lambda_entry(
    lambda_env: None, monkeypatch: pytest.MonkeyPatch, moto_server: MotoServer
) -> None:
    table = f"opstate-api-{uuid.uuid4().hex[:8]}"
    client = boto3.client("dynamodb", endpoint_url=moto_server.endpoint)
    create_table_from_template(client, table)
    monkeypatch.delenv("OPSTATE_STORE", raising=False)
    monkeypatch.setenv("OPSTATE_TABLE_NAME", table)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", moto_server.endpoint)
    run_event_story(load_entry().lambda_handler)
    item = client.get_item(TableName=table, Key={"name": {"S": SAMPLE_NAME}})["Item"]
    assert item["state"]["S"] == "SUCCEEDED"
    assert item["version"]["N"] == "1"


def test_event_files_with_a_frozen_verifier_clock() -> None:
    """The other documented way: build the app with the verifier's clock at EVENT_TIMESTAMP."""
    store = MemoryStore()
    app = api_module.create_app(
        store=store,
        verifier=StaticSecretsVerifier([TEST_SECRET], clock_s=lambda: EVENT_TIMESTAMP),
        settings=Settings(),
    )
    run_event_story(lambda event, context: app.resolve(event, context))
    assert [r.name for r in store.all()] == [SAMPLE_NAME, "batches/opstate-sample-2"]


def test_signed_sample_is_refused_with_the_real_clock(lambda_env: None) -> None:
    """Without a frozen clock or a huge tolerance, the sample's timestamp is long stale."""
    app = api_module.create_app(
        store=MemoryStore(),
        verifier=StaticSecretsVerifier([TEST_SECRET]),
        settings=settings(),
    )
    response = app.resolve(load_event("webhook-batch-succeeded.json"), None)  # type: ignore[arg-type]
    assert response["statusCode"] == 401


def test_event_files_match_their_generator() -> None:
    expected = sample_events()
    on_disk = sorted(p.name for p in EVENTS_DIR.glob("*.json"))
    assert on_disk == sorted(expected)
    for name, event in expected.items():
        assert (EVENTS_DIR / name).read_text() == render(event), (
            f"events/{name} is stale: run .venv/bin/python -m tests.support.webhooks"
        )
    readme = (EVENTS_DIR / "README.md").read_text()
    assert TEST_SECRET in readme
    assert str(EVENT_TIMESTAMP) in readme
    for name in expected:
        assert name in readme


def test_webhook_entry_does_not_import_google_genai_or_sqlite() -> None:
    """Neither the reconciler's SDK nor the local stores' sqlite3 belong in the webhook's init,
    nor JWT verification (off without OPSTATE_PUBLIC_URL) or the CLI's secret-file writers."""
    code = (
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(LAYER)!r})\n"
        f"spec = importlib.util.spec_from_file_location('entry', {str(ENTRY)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "assert callable(module.lambda_handler)\n"
        "heavy = (['google', 'genai'], ['google', 'auth'], ['google', 'oauth2'])\n"
        "loaded = sorted(m for m in sys.modules\n"
        "                if m.split('.')[:2] in heavy or m.startswith('opstate.reconcile'))\n"
        "lazy = ('sqlite3', '_sqlite3', 'opstate.signatures.jwt_tokens',\n"
        "        'opstate.webhook_secrets.files', 'opstate.webhook_secrets.rotation')\n"
        "loaded += sorted(m for m in sys.modules if m in lazy)\n"
        "print(','.join(loaded) or 'none')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "AWS_DEFAULT_REGION": "us-east-1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"
    # With Pub/Sub push configured, the token's verifier is built (PyJWT still loads on first
    # use), and still neither google-genai nor google-auth is imported.
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            code.replace(
                "lazy = ('sqlite3', '_sqlite3', 'opstate.signatures.jwt_tokens',",
                "lazy = ('sqlite3', '_sqlite3', 'jwt',",
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "AWS_DEFAULT_REGION": "us-east-1",
            "OPSTATE_PUBSUB_AUDIENCE": "https://example.invalid/google-cloud/pubsub",
            "OPSTATE_PUBSUB_EMAIL": "push@p1.iam.gserviceaccount.com",
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"
