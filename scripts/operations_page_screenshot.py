"""Regenerate the README's screenshot of the operations page from the current code.

    .venv/bin/python scripts/operations_page_screenshot.py [--out docs/img/operations-page.png]

Starts its own ``opstate serve`` (port 0, SQLite and the generated API token in a temporary
directory), feeds it one operation per state through the same routes Gemini and a producer use
(signed webhooks, ``PUT /operations/{name}``) - the Veo video by its full model name, which the
store keeps under ``models/-/operations/...`` - plus a stale redelivery of one webhook, opens the
page with the link serve prints in Debian's chromium (``/usr/bin/chromium``, or
``OPSTATE_CHROMIUM``) through Playwright, opens that operation's detail (the dropped
redelivery) and saves a full-page screenshot. The browser tests run it too
(``tests/browser``), into ``.artifacts/browser/``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import queue
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from standardwebhooks.webhooks import Webhook

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "img" / "operations-page.png"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT_WIDTH, VIEWPORT_HEIGHT = 1280, 860
# The operation whose detail is open in the picture: a delivery and Gemini's retry of it.
DETAIL = "batches/stale-1"


@dataclass(frozen=True)
class Shown:
    """What the screenshot shows: (name, state) per row, the open detail's reasons (newest
    first)."""

    rows: list[tuple[str, str]]
    detail_reasons: list[str]


@dataclass
class Server:
    process: subprocess.Popen[str]
    secret: str
    lines: list[str] = field(default_factory=list)
    url: str = ""
    page_link: str = ""
    token: str = ""


def _wait_for_start(server: Server, timeout_s: float = 60) -> None:
    """Read serve's output until ``listening on``; keep the page link it printed."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert server.process.stdout is not None
        for line in server.process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while True:
        line = lines.get(timeout=timeout_s)
        if line is None:
            raise RuntimeError("opstate serve stopped:\n" + "".join(server.lines))
        server.lines.append(line)
        if match := re.match(r"operations page: (http://\S+)", line):
            server.page_link = match.group(1)
            server.token = server.page_link.split("#token=", 1)[-1]
        if match := re.match(r"listening on (http://\S+)", line):
            server.url = match.group(1)
            return


@contextmanager
def serve(home: Path) -> Iterator[Server]:
    """``opstate serve`` on a fresh SQLite file in ``home``; stopped on exit."""
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPSTATE_", "GEMINI_"))}
    env.update(
        OPSTATE_WEBHOOK_SECRETS=secret,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(ROOT / "layers" / "opstate"), str(ROOT)]),
    )
    store = f"sqlite:///{home / 'ops.db'}"
    process = subprocess.Popen(
        [sys.executable, "-m", "opstate.cli", "serve", "--port", "0", "--store", store],
        cwd=home,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    server = Server(process, secret)
    try:
        _wait_for_start(server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _post(server: Server, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    request = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        method="PUT" if path.startswith("/operations/") else "POST",
        headers={"content-type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def webhook(server: Server, event_type: str, name: str, when: str, **data: Any) -> Any:
    """A delivery signed as Gemini signs it (Standard Webhooks, the current time)."""
    raw = json.dumps(
        {"type": event_type, "version": "v1", "timestamp": when, "data": {"id": name, **data}}
    )
    msg_id = f"msg_{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    request = urllib.request.Request(
        server.url + "/gemini/webhook",
        data=raw.encode(),
        method="POST",
        headers={
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": Webhook(server.secret).sign(msg_id, now, raw),
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def report(server: Server, name: str, state: str, when: str) -> Any:
    """A producer's report (``PUT /operations/{name}``, the API token)."""
    return _post(
        server,
        f"/operations/{name}",
        {"state": state, "updateTime": when},
        {"Authorization": f"Bearer {server.token}"},
    )


def populate(server: Server) -> None:
    """One operation per state, the video by its full model name, and a stale redelivery."""
    report(server, "batches/nightly-embeddings", "PENDING", "2026-11-30T12:40:00Z")
    report(
        server,
        "models/veo-3.1-generate-preview/operations/demo-video",
        "RUNNING",
        "2026-11-30T12:30:00Z",
    )
    webhook(
        server, "interaction.requires_action", "interactions/support-42", "2026-11-30T12:45:00Z"
    )
    webhook(server, "batch.failed", "batches/eval-run-7", "2026-11-30T11:20:00Z", error_code=3)
    webhook(server, "batch.cancelled", "batches/backfill-2025", "2026-11-30T10:05:00Z")
    delivery = ("batch.succeeded", DETAIL, "2026-11-30T12:00:00Z")
    webhook(server, *delivery, output_file_uri="files/stale-out")
    again = webhook(server, *delivery, output_file_uri="files/stale-out")  # Gemini's retry
    if again.get("reason") != "stale-or-equal-update-time":
        raise RuntimeError(f"the redelivery was not dropped as stale: {again}")


def chromium_path() -> str:
    configured = os.environ.get("OPSTATE_CHROMIUM")
    for candidate in (configured, "/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("chromium")
    if found is None:
        raise RuntimeError("no chromium found: apt-get install -y chromium (or OPSTATE_CHROMIUM)")
    return found


def _shoot(context: Any, server: Server, out: Path) -> Shown:
    page = context.new_page()
    try:
        page.set_viewport_size({"width": VIEWPORT_WIDTH, "height": VIEWPORT_HEIGHT})
        page.goto(server.page_link)  # the link as serve printed it
        page.wait_for_selector("#status:has-text('Live')")
        page.wait_for_selector(f"tr[data-name='{DETAIL}']")
        page.get_by_role("button", name=f"Show {DETAIL}").click()
        page.locator("#decision-rows tr").nth(1).wait_for()
        rows = page.locator("#rows tr").evaluate_all(
            "rs => rs.map(r => [r.dataset.name, r.querySelector('.badge').textContent])"
        )
        reasons = page.locator("#decision-rows td.reason").all_inner_texts()
        page.mouse.move(0, 0)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=True)
    finally:
        page.close()
    return Shown([(str(n), str(s)) for n, s in rows], [str(r) for r in reasons])


def take_screenshot(out: Path, context: Any | None = None) -> Shown:
    """Serve, populate, open the page and save the screenshot to ``out``. ``context``: a
    Playwright browser context to use (the browser tests pass theirs); else one is launched."""
    with (
        tempfile.TemporaryDirectory(prefix="opstate-screenshot-") as tmp,
        serve(Path(tmp)) as server,
    ):
        populate(server)
        if context is not None:
            return _shoot(context, server, out)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
            )
            try:
                viewport: Any = {"width": VIEWPORT_WIDTH, "height": VIEWPORT_HEIGHT}
                launched = browser.new_context(viewport=viewport, locale="en-GB", timezone_id="UTC")
                return _shoot(launched, server, out)
            finally:
                browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    args = parser.parse_args(argv)
    shown = take_screenshot(args.out)
    states = ", ".join(sorted({state for _, state in shown.rows}))
    print(f"wrote {args.out}: {len(shown.rows)} operations ({states})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
