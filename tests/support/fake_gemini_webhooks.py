"""A fake of the Gemini API's webhook endpoints, for the real google-genai client.

``http.server`` on 127.0.0.1 speaking the REST shapes google-genai 3.x sends and parses (see
``google/genai/_gaos/webhooks.py``): ``GET/POST /{version}/webhooks``,
``GET /{version}/webhooks/{id}``, ``POST /{version}/webhooks/{id}:rotateSigningSecret``.
JSON field names are snake_case, as the SDK's models carry no aliases.

Each webhook keeps its full secrets (the fake's own state) and lists them truncated, the way
Gemini shows them. ``revoke(id, secret)`` lets a test expire a secret as Gemini would after 24 h.
Two hooks stage races: ``rotate_barrier`` holds each rotation until that many are in flight (two
overlapping ``opstate webhooks rotate`` runs), ``after_create`` runs before a create is answered.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_PATH = re.compile(r"/(?P<version>v[0-9a-z]+)/webhooks(?:/(?P<id>[^/:]+))?(?::(?P<verb>\w+))?")


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def truncate(secret: str) -> str:
    return f"{secret[:10]}...{secret[-4:]}"


@dataclass
class FakeWebhook:
    id: str
    uri: str
    subscribed_events: list[str]
    name: str | None = None
    state: str = "enabled"
    # (secret, expire_time or None), newest first
    secrets: list[tuple[str, datetime | None]] = field(default_factory=list)
    created: datetime = field(default_factory=lambda: datetime.now(UTC))

    def as_json(self, *, new_secret: str | None = None) -> dict[str, Any]:
        now = datetime.now(UTC)
        body: dict[str, Any] = {
            "id": self.id,
            "uri": self.uri,
            "subscribed_events": self.subscribed_events,
            "state": self.state,
            "create_time": self.created.isoformat().replace("+00:00", "Z"),
            "update_time": now.isoformat().replace("+00:00", "Z"),
            "signing_secrets": [
                {"truncated_secret": truncate(s)}
                | ({"expire_time": e.isoformat().replace("+00:00", "Z")} if e else {})
                for s, e in self.secrets
                if e is None or e > now
            ],
        }
        if self.name is not None:
            body["name"] = self.name
        if new_secret is not None:
            body["new_signing_secret"] = new_secret
        return body


class FakeGeminiWebhooks:
    def __init__(self) -> None:
        self.webhooks: dict[str, FakeWebhook] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()
        self._counter = 0
        self.rotate_barrier: threading.Barrier | None = None
        self.after_create: Callable[[], None] | None = None
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeGeminiWebhooks:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def revoke(self, webhook_id: str, secret: str) -> None:
        """Expire ``secret`` now (what Gemini does 24 h after a rotation)."""
        with self.lock:
            hook = self.webhooks[webhook_id]
            past = datetime.now(UTC) - timedelta(seconds=1)
            hook.secrets = [(s, past if s == secret else e) for s, e in hook.secrets]

    def current_secret(self, webhook_id: str) -> str:
        with self.lock:
            return self.webhooks[webhook_id].secrets[0][0]

    # -- request handling --------------------------------------------------------------------

    def handle(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        barrier = self.rotate_barrier
        if barrier is not None and path.split("?", 1)[0].endswith(":rotateSigningSecret"):
            barrier.wait(timeout=30)  # outside the lock: the other rotation must get in too
        answer = self._handle(method, path, body)
        if (
            self.after_create is not None
            and method == "POST"
            and path.split("?", 1)[0].endswith("/webhooks")
        ):
            self.after_create()
        return answer

    def _handle(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.requests.append((method, path, body))
            m = _PATH.fullmatch(path.split("?", 1)[0])
            if m is None:
                return 404, _error(404, f"no such path {path}")
            hook_id, verb = m.group("id"), m.group("verb")
            if hook_id is None and method == "GET":
                return 200, {"webhooks": [h.as_json() for h in self.webhooks.values()]}
            if hook_id is None and method == "POST":
                return self._create(body)
            hook = self.webhooks.get(hook_id or "")
            if hook is None:
                return 404, _error(404, f"webhook {hook_id} not found")
            if verb is None and method == "GET":
                return 200, hook.as_json()
            if verb == "rotateSigningSecret" and method == "POST":
                return self._rotate(hook, body or {})
            return 405, _error(405, "method not allowed")

    def _create(self, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict):
            return 400, _error(400, "body must be a JSON object")
        uri = body.get("uri")
        events = body.get("subscribed_events") or body.get("subscribedEvents")
        if not isinstance(uri, str) or not uri.startswith("https://"):
            return 400, _error(400, "uri must be an https URL")
        if not events:
            return 400, _error(400, "subscribed_events is required")
        self._counter += 1
        hook = FakeWebhook(
            id=f"wh{self._counter}", uri=uri, subscribed_events=list(events), name=body.get("name")
        )
        secret = new_secret()
        hook.secrets.insert(0, (secret, None))
        self.webhooks[hook.id] = hook
        return 200, hook.as_json(new_secret=secret)

    def _rotate(self, hook: FakeWebhook, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        behavior = body.get("revocation_behavior") or body.get("revocationBehavior")
        now = datetime.now(UTC)
        expiry = (
            now - timedelta(seconds=1)
            if behavior == "revoke_previous_secrets_immediately"
            else now + timedelta(hours=24)
        )
        hook.secrets = [(s, e if e is not None else expiry) for s, e in hook.secrets]
        secret = new_secret()
        hook.secrets.insert(0, (secret, None))
        return 200, {"secret": secret}


def _error(code: int, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": "INVALID_ARGUMENT"}}


def _handler(fake: FakeGeminiWebhooks) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            status, answer = fake.handle(self.command, self.path, body)
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler
