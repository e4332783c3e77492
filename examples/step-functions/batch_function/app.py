"""The example state machine's own Lambda function (examples/step-functions/README.md).

- ``{"action": "submit", "model", "requests"}``: start a Gemini batch (google-genai, the API key
  in ``GEMINI_API_KEY``) and return its name;
- ``{"action": "wait", "name", "taskToken", "when"}``: register the task token as a
  gemini-opstate waiter (``PUT {OPSTATE_API_URL}{name}`` with ``{"waiter": ...}``: this also
  tracks the job) and return. The state machine then sleeps until gemini-opstate answers the
  token; nothing polls.

The operations API is IAM-authorised: the request is SigV4-signed with the function's role
(``execute-api:Invoke`` on the API). ``OPSTATE_API_TOKEN`` switches to a bearer token for a
local ``opstate serve``. The token is a secret: it is sent, never logged.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote


# The exception's name is the error the state machine retries on.
class OpstateUnavailable(Exception):
    """gemini-opstate answered 5xx or could not be reached: Step Functions retries the task."""


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    action = event.get("action")
    if action == "submit":
        return {"name": submit_batch(event["model"], event["requests"])}
    if action == "wait":
        waiter = {
            "stepFunctionsTaskToken": event["taskToken"],
            "when": event.get("when") or "terminal",
        }
        answer = put_operation(event["name"], {"waiter": waiter})
        return {"name": event["name"], "waiter": answer.get("waiter", {}).get("id")}
    raise ValueError(f"unknown action {action!r}")


def submit_batch(model: str, requests: list[dict[str, Any]]) -> str:
    from google import genai

    job = genai.Client().batches.create(model=model, src=requests)
    return str(job.name)


def _signed_headers(url: str, body: bytes) -> dict[str, str]:
    token = os.environ.get("OPSTATE_API_TOKEN")
    headers = {"content-type": "application/json"}
    if token:
        return {**headers, "authorization": f"Bearer {token}"}
    import boto3
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    session = boto3.Session()
    request = AWSRequest(method="PUT", url=url, data=body, headers=headers)
    SigV4Auth(session.get_credentials(), "execute-api", session.region_name).add_auth(request)
    return dict(request.headers.items())


def put_operation(name: str, body: dict[str, Any]) -> dict[str, Any]:
    """PUT the body to the operations API; 5xx or no answer raise ``OpstateUnavailable``."""
    url = os.environ["OPSTATE_API_URL"].rstrip("/") + "/" + quote(name, safe="/")
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers=_signed_headers(url, data), method="PUT"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            raise OpstateUnavailable(f"gemini-opstate answered {exc.code}") from None
        raise RuntimeError(
            f"gemini-opstate refused the waiter: {exc.code} {exc.read()[:300]!r}"
        ) from None
    except urllib.error.URLError as exc:
        raise OpstateUnavailable(f"gemini-opstate unreachable: {exc.reason}") from None
