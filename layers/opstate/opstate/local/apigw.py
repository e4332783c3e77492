"""API Gateway HTTP API (payload format 2.0) events and the Lambda context, for local use.

``build_event`` turns one HTTP request into the event API Gateway would hand the function;
``response_parts`` turns the resolver's answer back into status, headers and body;
``LocalLambdaContext`` stands in for the Lambda context. Used by ``opstate serve`` and by tests
and benchmarks that drive the app without AWS. Imports only ``opstate.domain.routes``.
"""

from __future__ import annotations

import base64
import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from opstate.domain.routes import OPERATIONS_PATH, OPERATIONS_PREFIX, PUBSUB_PATH, WEBHOOK_PATH


@dataclasses.dataclass(frozen=True)
class LocalLambdaContext:
    """The few Lambda context attributes the app and Powertools read.

    ``get_remaining_time_in_millis`` answers ``remaining_ms`` (tests set it to try a budget).
    """

    function_name: str = "opstate-local"
    function_version: str = "$LATEST"
    invoked_function_arn: str = "arn:aws:lambda:local:000000000000:function:opstate-local"
    memory_limit_in_mb: int = 512
    aws_request_id: str = ""
    log_group_name: str = "/aws/lambda/opstate-local"
    log_stream_name: str = "local"
    remaining_ms: int = 30_000

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def _route_key(method: str, path: str) -> tuple[str, dict[str, str] | None]:
    """The route API Gateway would match and the path parameters it would set."""
    if method == "POST" and path in (WEBHOOK_PATH, PUBSUB_PATH):
        return f"POST {path}", None
    if method in ("GET", "PUT") and path.startswith(OPERATIONS_PREFIX):
        rest = path[len(OPERATIONS_PREFIX) :]
        if rest:
            return f"{method} {OPERATIONS_PATH}", {"name": unquote(rest)}
    return "$default", None


def build_event(
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    *,
    source_ip: str = "127.0.0.1",
    now: datetime | None = None,
) -> dict[str, Any]:
    """The API Gateway HTTP API (payload 2.0) event for one HTTP request.

    Header names are lower-cased and repeated headers joined with commas (cookies go to
    ``cookies``); the body is text when it is UTF-8, else base64 with ``isBase64Encoded``.
    """
    now = now or datetime.now(UTC)
    split = urlsplit(target)
    raw_path = split.path or "/"
    raw_query = split.query
    merged: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in headers:
        key = name.lower()
        if key == "cookie":
            cookies.extend(c.strip() for c in value.split(";") if c.strip())
            continue
        merged[key] = f"{merged[key]},{value}" if key in merged else value
    query: dict[str, str] = {}
    for key, value in parse_qsl(raw_query, keep_blank_values=True):
        query[key] = f"{query[key]},{value}" if key in query else value
    route_key, path_parameters = _route_key(method, unquote(raw_path))
    request_id = uuid.uuid4().hex
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": raw_path,
        "rawQueryString": raw_query,
        "headers": merged,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": merged.get("host", "localhost"),
            "domainPrefix": merged.get("host", "localhost").split(".")[0],
            "http": {
                "method": method,
                "path": raw_path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": merged.get("user-agent", ""),
            },
            "requestId": request_id,
            "routeKey": route_key,
            "stage": "$default",
            "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "timeEpoch": int(now.timestamp() * 1000),
        },
        "isBase64Encoded": False,
    }
    if cookies:
        event["cookies"] = cookies
    if query:
        event["queryStringParameters"] = query
    if path_parameters is not None:
        event["pathParameters"] = path_parameters
    if body:
        try:
            event["body"] = body.decode("utf-8")
        except UnicodeDecodeError:
            event["body"] = base64.b64encode(body).decode("ascii")
            event["isBase64Encoded"] = True
    return event


def response_parts(result: Mapping[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body bytes of a resolver's (API Gateway v2) response."""
    status = int(result.get("statusCode", 200))
    headers: list[tuple[str, str]] = []
    for key, value in (result.get("headers") or {}).items():
        headers.append((str(key), str(value)))
    for key, values in (result.get("multiValueHeaders") or {}).items():
        headers.extend((str(key), str(v)) for v in values)
    headers.extend(("Set-Cookie", str(c)) for c in result.get("cookies") or ())
    raw = result.get("body")
    if raw is None:
        body = b""
    elif result.get("isBase64Encoded"):
        body = base64.b64decode(raw)
    else:
        # The API's JSON is always encodable; anything else never makes a response fail.
        body = str(raw).encode("utf-8", "replace")
    return status, headers, body
