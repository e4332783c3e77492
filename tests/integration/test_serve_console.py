"""``opstate serve`` serves the operations page and its token-protected data (no browser)."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

from standardwebhooks.webhooks import Webhook

from tests.support.serve_process import TEST_API_TOKEN, http, start_serve

SECRET = "whsec_" + base64.b64encode(b"opstate-console-test-secret-32by").decode()


def test_serve_prints_the_page_url_and_guards_its_data(tmp_path: Path) -> None:
    proc = start_serve(
        ["--store", f"sqlite:///{tmp_path / 'ops.db'}"],
        cwd=tmp_path,
        env={"OPSTATE_WEBHOOK_SECRETS": SECRET},  # OPSTATE_API_TOKEN: TEST_API_TOKEN
    )
    try:
        line = proc.wait_for_line(r"operations page: ")
        # A token from OPSTATE_API_TOKEN is never echoed: the plain link, and what to paste.
        assert line.strip() == f"operations page: {proc.url}/"
        hint = proc.wait_for_line(r"the page asks for the API token")
        assert "paste the value of OPSTATE_API_TOKEN" in hint
        assert TEST_API_TOKEN not in proc.output()
        status, _, help_body = http("GET", proc.url + "/ui/api/token-help", token=None)
        assert (status, help_body) == (
            200,
            {"file": None, "variable": "OPSTATE_API_TOKEN", "refresh": False},
        )
        # Without a Gemini key the page's poll-now route says what is missing.
        status, _, refused = http("POST", proc.url + "/ui/api/refresh?name=batches/b1", b"")
        assert (status, refused["error"]) == (409, "no-gemini-key")

        status, headers, page = http("GET", proc.url + "/", token=None)
        assert status == 200 and "<title>opstate · operations</title>" in page
        assert "script-src 'self'" in headers["Content-Security-Policy"]

        raw = json.dumps(
            {"type": "batch.succeeded", "timestamp": "2026-11-30T10:00:00Z", "data": {"id": "b1"}}
        )
        msg_id, now = f"msg_{uuid.uuid4().hex}", datetime.now(UTC)
        headers = {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": Webhook(SECRET).sign(msg_id, now, raw),
        }
        for _ in range(2):  # the delivery and its redelivery
            assert http("POST", proc.url + "/gemini/webhook", raw.encode(), headers)[0] == 200

        assert http("GET", proc.url + "/ui/api/operations", token=None)[0] == 401
        assert http("GET", proc.url + "/ui/api/operations", token="not-the-token")[0] == 401
        status, _, listing = http("GET", proc.url + "/ui/api/operations")
        assert status == 200
        assert [(o["name"], o["state"]) for o in listing["operations"]] == [
            ("batches/b1", "SUCCEEDED")
        ]
        status, _, detail = http("GET", proc.url + "/ui/api/operation?name=batches%2Fb1")
        assert status == 200
        assert [(d["applied"], d["reason"]) for d in detail["decisions"]] == [
            (True, "created"),
            (False, "stale-or-equal-update-time"),
        ]
        # The API's own routes are still the API's.
        assert http("GET", proc.url + "/operations/batches/b1")[0] == 200
        assert http("GET", proc.url + "/operations/batches/b1", token=None)[0] == 401
    finally:
        assert proc.terminate() == 0
