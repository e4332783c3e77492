"""Standard Webhooks signing (independent of ``opstate.signatures``), API Gateway HTTP API v2
events, and the sample events under ``events/``.

The sample events are signed with the FIXED test secret below at a FIXED ``webhook-timestamp``;
a verifier accepts them only with its clock frozen at ``EVENT_TIMESTAMP`` (tests) or with a huge
tolerance (``sam local invoke``, see ``events/README.md``).

Regenerate the files after changing this module: ``.venv/bin/python -m tests.support.webhooks``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Test-only secrets: published on purpose, never used anywhere real.
TEST_SECRET = (
    "whsec_Z2VtaW5pLW9wc3RhdGUtZml4ZWQtdGVzdC1zZWNyZXQ="  # b"gemini-opstate-fixed-test-secret"
)
ROTATED_SECRET = (
    "whsec_Z2VtaW5pLW9wc3RhdGUtcm90YXRlZC1zZWNyZXQtMDI="  # b"gemini-opstate-rotated-secret-02"
)
OTHER_SECRET = "whsec_" + base64.b64encode(b"not-the-configured-secret-at-all").decode()
EVENT_TIMESTAMP = 1778407200  # 2026-05-10T10:00:00Z
SAMPLE_NAME = "batches/opstate-sample-1"
MAX_BODY_BYTES = 256 * 1024

EVENTS_DIR = Path(__file__).resolve().parents[2] / "events"


def secret_key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix("whsec_"))


def sign(secret: str, msg_id: str, timestamp: int | str, body: bytes) -> str:
    """One ``v1,<base64>`` entry: HMAC-SHA256 over ``{id}.{timestamp}.{body}``."""
    to_sign = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), to_sign, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(
    body: bytes,
    *,
    secrets: tuple[str, ...] = (TEST_SECRET,),
    msg_id: str | None = "msg_2abc0sample",
    timestamp: int | None = EVENT_TIMESTAMP,
) -> dict[str, str]:
    """Standard Webhooks headers of ``body``, signed with each of ``secrets``.

    The defaults are the FIXED sample id and timestamp; as a live sender does, ``msg_id=None``
    takes a fresh random id and ``timestamp=None`` the current time (for a verifier with a clock).
    """
    if msg_id is None:
        msg_id = f"msg_{uuid.uuid4().hex}"
    if timestamp is None:
        timestamp = int(time.time())
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, msg_id, timestamp, body) for s in secrets),
    }


def http_event(
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    base64_encoded: bool = False,
    route_key: str | None = None,
    path_parameters: Mapping[str, str] | None = None,
    iam: bool = False,
) -> dict[str, Any]:
    """An API Gateway HTTP API (payload format 2.0) event."""
    all_headers = {
        "host": "abc123.execute-api.us-east-1.amazonaws.com",
        "user-agent": "gemini-opstate-tests",
        "x-forwarded-proto": "https",
        **(headers or {}),
    }
    if body is not None:
        all_headers["content-length"] = str(len(body))
    context: dict[str, Any] = {
        "accountId": "123456789012",
        "apiId": "abc123",
        "domainName": "abc123.execute-api.us-east-1.amazonaws.com",
        "domainPrefix": "abc123",
        "http": {
            "method": method,
            "path": path,
            "protocol": "HTTP/1.1",
            "sourceIp": "192.0.2.10",
            "userAgent": "gemini-opstate-tests",
        },
        "requestId": "sample-request-id",
        "routeKey": route_key or f"{method} {path}",
        "stage": "$default",
        "time": "10/May/2026:10:00:00 +0000",
        "timeEpoch": EVENT_TIMESTAMP * 1000,
    }
    if iam:
        context["authorizer"] = {
            "iam": {
                "accessKey": "AKIAEXAMPLE",
                "accountId": "123456789012",
                "callerId": "AIDAEXAMPLE",
                "principalOrgId": None,
                "userArn": "arn:aws:iam::123456789012:user/producer",
                "userId": "AIDAEXAMPLE",
            }
        }
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route_key or f"{method} {path}",
        "rawPath": path,
        "rawQueryString": "",
        "headers": all_headers,
        "requestContext": context,
        "isBase64Encoded": base64_encoded,
    }
    if path_parameters:
        event["pathParameters"] = dict(path_parameters)
    if body is not None:
        event["body"] = base64.b64encode(body).decode() if base64_encoded else body.decode()
    return event


def webhook_event(
    body: bytes, headers: Mapping[str, str], *, base64_encoded: bool = False
) -> dict[str, Any]:
    return http_event(
        "POST", "/gemini/webhook", body=body, headers=headers, base64_encoded=base64_encoded
    )


def operation_event(method: str, name: str, body: bytes | None = None) -> dict[str, Any]:
    return http_event(
        method,
        f"/operations/{name}",
        body=body,
        headers={"content-type": "application/json"} if body is not None else None,
        route_key=f"{method} /operations/{{name+}}",
        path_parameters={"name": name},
        iam=True,
    )


def compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


SUCCEEDED_BODY = compact(
    {
        "type": "batch.succeeded",
        "version": "v1",
        "timestamp": "2026-05-10T09:59:58.123456789Z",
        "data": {
            "id": SAMPLE_NAME,
            "output_file_uri": "files/opstate-sample-1-output",
            "user_metadata": {"team": "docs"},
        },
    }
)
STALE_REPORT_BODY = compact(
    {"state": "RUNNING", "updateTime": "2026-05-10T09:30:00Z", "details": {"progress": 0.5}}
)
MALFORMED_BODY = b'{"type": "batch.succeeded", "data": {"id": "batches/opstate-sample-1"'


def _oversized_body() -> bytes:
    head = {"type": "batch.succeeded", "data": {"id": SAMPLE_NAME, "user_metadata": {"pad": ""}}}
    base = len(compact(head))
    head["data"]["user_metadata"]["pad"] = "x" * (MAX_BODY_BYTES + 1 - base)  # type: ignore[index]
    body = compact(head)
    assert len(body) == MAX_BODY_BYTES + 1
    return body


# `sam local` (events/env.json): the table / bus names the local functions use.
LOCAL_TABLE = "opstate-local"
LOCAL_EVENT_BUS = "opstate-local"
LOCAL_GEMINI_API_KEY = "local-gemini-api-key"
LOCAL_RESULTS_BUCKET = "opstate-local-results"
LOCAL_RESULTS_URL = f"s3://{LOCAL_RESULTS_BUCKET}/results"
# Where a retry input named over HTTP may be (the template's !Sub of the stack's bucket reaches a
# sam local function unresolved, as s3://ResultsBucket/incoming/, which the settings refuse).
LOCAL_RETRY_INPUT_PREFIXES = f"s3://{LOCAL_RESULTS_BUCKET}/incoming/"


def local_env_vars() -> dict[str, dict[str, str]]:
    """events/env.json, the ``sam local --env-vars`` file of docs/deploy.md: the test secret,
    a tolerance wide enough for the fixed timestamp, no Secrets Manager, no quarantine queue (an
    unreadable signed delivery is logged whole instead), local names (the archiver's and the
    submit function's results bucket and the retry input prefixes too: the template's URLs name
    the stack's bucket). Endpoints
    (``AWS_ENDPOINT_URL``, ``GOOGLE_GEMINI_BASE_URL``) come from the shell: SAM passes a
    variable the template declares from the environment when the file does not set it."""
    return {
        "Parameters": {"OPSTATE_TABLE_NAME": LOCAL_TABLE},
        "WebhookFunction": {
            "OPSTATE_WEBHOOK_SECRETS": TEST_SECRET,
            "OPSTATE_WEBHOOK_SECRET_ARN": "",
            "OPSTATE_WEBHOOK_TOLERANCE_SECONDS": "2000000000",
            "OPSTATE_QUARANTINE_QUEUE_URL": "",
            "OPSTATE_RETRY_INPUT_PREFIXES": LOCAL_RETRY_INPUT_PREFIXES,
        },
        "ReconcileFunction": {
            "OPSTATE_GEMINI_API_KEY_SECRET_ARN": "",
            "GEMINI_API_KEY": LOCAL_GEMINI_API_KEY,
        },
        "NotifyFunction": {"OPSTATE_EVENT_BUS_NAME": LOCAL_EVENT_BUS},
        "ArchiverFunction": {
            "OPSTATE_GEMINI_API_KEY_SECRET_ARN": "",
            "GEMINI_API_KEY": LOCAL_GEMINI_API_KEY,
            "OPSTATE_RESULTS_URL": LOCAL_RESULTS_URL,
            "OPSTATE_RETRY_INPUT_PREFIXES": LOCAL_RETRY_INPUT_PREFIXES,
        },
        "SubmitFunction": {
            "OPSTATE_GEMINI_API_KEY_SECRET_ARN": "",
            "GEMINI_API_KEY": LOCAL_GEMINI_API_KEY,
            "OPSTATE_RESULTS_URL": LOCAL_RESULTS_URL,
        },
    }


def sample_events() -> dict[str, dict[str, Any]]:
    """Every file under events/ (except README.md), by file name."""
    oversized = _oversized_body()
    bad_headers = signed_headers(SUCCEEDED_BODY, secrets=(OTHER_SECRET,), msg_id="msg_2abc0bad")
    return {
        "webhook-batch-succeeded.json": webhook_event(
            SUCCEEDED_BODY, signed_headers(SUCCEEDED_BODY)
        ),
        "webhook-batch-succeeded-base64.json": webhook_event(
            SUCCEEDED_BODY, signed_headers(SUCCEEDED_BODY), base64_encoded=True
        ),
        "webhook-bad-signature.json": webhook_event(SUCCEEDED_BODY, bad_headers),
        "webhook-oversized.json": webhook_event(
            oversized, signed_headers(oversized, msg_id="msg_2abc0big")
        ),
        "webhook-malformed-json.json": webhook_event(
            MALFORMED_BODY, signed_headers(MALFORMED_BODY, msg_id="msg_2abc0malformed")
        ),
        "report-stale.json": operation_event("PUT", SAMPLE_NAME, STALE_REPORT_BODY),
        "report-track.json": operation_event("PUT", "batches/opstate-sample-2"),
        "get-operation.json": operation_event("GET", SAMPLE_NAME),
        "schedule.json": {
            "version": "0",
            "id": "7bf73129-1428-4cd3-a780-95db273d1602",
            "detail-type": "Scheduled Event",
            "source": "aws.scheduler",
            "account": "123456789012",
            "time": "2026-05-10T10:00:00Z",
            "region": "us-east-1",
            "resources": [
                "arn:aws:scheduler:us-east-1:123456789012:schedule/default/opstate-reconcile"
            ],
            "detail": {},
        },
        "env.json": local_env_vars(),
    }


def load_event(file_name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EVENTS_DIR / file_name).read_text())
    return data


def render(event: Mapping[str, Any]) -> str:
    return json.dumps(event, indent=2) + "\n"


def write_sample_events(directory: Path = EVENTS_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, event in sample_events().items():
        path = directory / file_name
        path.write_text(render(event))
        written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write_sample_events():
        print(written_path)
