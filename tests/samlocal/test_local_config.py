"""The `sam local` configuration, checked without Docker: events/env.json is what
docs/deploy.md shows, the template declares every variable it (or the shell) sets, those
declarations change nothing in AWS, and the sam local tests expect what events/README.md
promises."""

from __future__ import annotations

import json
import re
from typing import Any

import boto3
import pytest

from opstate.config import Settings
from tests.samlocal.harness import ENV_FILE, EVENTS_DIR, ROOT
from tests.support.template import load_template
from tests.support.webhooks import SAMPLE_NAME, local_env_vars

DEPLOY_DOC = ROOT / "docs" / "deploy.md"
FUNCTIONS = (
    "WebhookFunction",
    "ReconcileFunction",
    "NotifyFunction",
    "ArchiverFunction",
    "SubmitFunction",
)
# Set from the shell, not the file (they depend on where the servers listen): see harness.py.
FROM_SHELL = {
    "WebhookFunction": {"AWS_ENDPOINT_URL"},
    "ReconcileFunction": {"AWS_ENDPOINT_URL", "GOOGLE_GEMINI_BASE_URL"},
    "NotifyFunction": {"AWS_ENDPOINT_URL"},
    "ArchiverFunction": {"AWS_ENDPOINT_URL", "GOOGLE_GEMINI_BASE_URL"},
    "SubmitFunction": {"AWS_ENDPOINT_URL", "GOOGLE_GEMINI_BASE_URL"},
}
# Declared for sam local only, with an empty default.
LOCAL_ONLY = {
    "OPSTATE_STORE",
    "AWS_ENDPOINT_URL",
    "OPSTATE_WEBHOOK_SECRETS",
    "OPSTATE_WEBHOOK_TOLERANCE_SECONDS",
    "GEMINI_API_KEY",
    "GOOGLE_GEMINI_BASE_URL",
    "GOOGLE_VERTEX_BASE_URL",
}
README = EVENTS_DIR / "README.md"
SCHEDULE = "schedule.json"
SAMPLE_UPDATE_TIME = "2026-05-10T09:59:58.123456789Z"

# What events/README.md promises for each API event, invoked in the README's order on an empty
# table: (status, the body's fields). test_expectations_follow_the_readme keeps the two in step.
PROMISED: dict[str, tuple[int, dict[str, Any]]] = {
    "webhook-batch-succeeded.json": (
        200,
        {"applied": True, "reason": "created", "state": "SUCCEEDED", "version": 1},
    ),
    "webhook-batch-succeeded-base64.json": (
        200,
        {"applied": False, "reason": "stale-or-equal-update-time"},
    ),
    "report-stale.json": (
        200,
        {"applied": False, "reason": "regress-from-terminal", "state": "SUCCEEDED"},
    ),
    "report-track.json": (200, {"state": "PENDING"}),
    "get-operation.json": (
        200,
        {"name": SAMPLE_NAME, "state": "SUCCEEDED", "updateTime": SAMPLE_UPDATE_TIME},
    ),
    "webhook-bad-signature.json": (
        401,
        {"error": "invalid-signature", "message": "invalid signature"},
    ),
    "webhook-oversized.json": (413, {"error": "payload-too-large"}),
    "webhook-malformed-json.json": (
        200,
        {"applied": False, "reason": "quarantined", "error": "malformed-json"},
    ),
}


def readme_order() -> list[str]:
    """The event files in the order of events/README.md's table."""
    return re.findall(r"^\| `([\w.-]+\.json)` \|", README.read_text(encoding="utf-8"), re.M)


def readme_row(name: str) -> str:
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith(f"| `{name}` |"):
            return line
    raise AssertionError(f"{name} has no row in events/README.md")


def test_expectations_follow_the_readme() -> None:
    """The README's table lists every event file (and only them); each promised status and
    reason below is the README's. (No Docker needed.)"""
    on_disk = sorted(p.name for p in EVENTS_DIR.glob("*.json") if p.name != "env.json")
    assert sorted(readme_order()) == on_disk
    assert [n for n in readme_order() if n != SCHEDULE] == list(PROMISED)
    for name, (status, fields) in PROMISED.items():
        row = readme_row(name)
        assert str(status) in row, (name, row)
        for key in ("reason", "error", "state"):
            if key in fields:
                assert str(fields[key]) in row, (name, key, row)


def declared(template: dict[str, Any], function: str) -> dict[str, Any]:
    variables: dict[str, Any] = {}
    globals_env = template.get("Globals", {}).get("Function", {}).get("Environment", {})
    variables.update(globals_env.get("Variables", {}))
    props = template["Resources"][function]["Properties"]
    variables.update(props.get("Environment", {}).get("Variables", {}))
    return variables


def test_the_env_file_is_generated_and_shown_verbatim_in_the_docs() -> None:
    text = ENV_FILE.read_text(encoding="utf-8")
    assert json.loads(text) == local_env_vars()
    doc = DEPLOY_DOC.read_text(encoding="utf-8")
    section = doc[doc.index("## Running locally with Docker") :]
    blocks = re.findall(r"```json\n(.*?)```", section, re.S)
    assert blocks, "docs/deploy.md shows no env.json"
    assert blocks[0] == text
    assert "--env-vars events/env.json" in section


def test_the_template_declares_every_variable_set_locally() -> None:
    """SAM's --env-vars (and the shell) only reach declared variables: an undeclared one is
    silently dropped (the signed sample event then gets 401 under sam local invoke)."""
    template = load_template()
    env_file = json.loads(ENV_FILE.read_text(encoding="utf-8"))
    for function in FUNCTIONS:
        wanted = set(env_file.get("Parameters", {})) | set(env_file.get(function, {}))
        wanted |= FROM_SHELL[function]
        missing = wanted - set(declared(template, function))
        assert not missing, f"{function} does not declare {sorted(missing)}"
    assert set(env_file) == {"Parameters", *FUNCTIONS}


def test_the_local_only_declarations_change_nothing_in_aws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    template = load_template()
    empty = {
        name
        for function in FUNCTIONS
        for name, value in declared(template, function).items()
        if value == ""
    }
    assert empty == LOCAL_ONLY
    # Empty means unset to the code ...
    assert Settings.from_env(dict.fromkeys(LOCAL_ONLY, "")) == Settings.from_env({})
    # ... to boto3 ...
    monkeypatch.setenv("AWS_ENDPOINT_URL", "")
    client = boto3.client("dynamodb", region_name="us-east-1")
    assert client.meta.endpoint_url == "https://dynamodb.us-east-1.amazonaws.com"
    # ... and to google-genai.
    from google import genai

    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", "")
    gemini = genai.Client(api_key="unused")
    assert gemini._api_client._http_options.base_url == "https://generativelanguage.googleapis.com/"
    monkeypatch.setenv("GOOGLE_VERTEX_BASE_URL", "")
    vertex = genai.Client(
        vertexai=True,
        project="p1",
        location="us-central1",
        credentials=Unused(),  # type: ignore[arg-type]  # a stand-in: no token is ever asked
    )
    assert vertex._api_client._http_options.base_url == (
        "https://us-central1-aiplatform.googleapis.com/"
    )


class Unused:
    """Credentials never asked for a token (building a client makes no request)."""

    quota_project_id = None
    token = "unused"
    expired = False
