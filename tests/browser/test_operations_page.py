"""The operations page of ``opstate serve`` in a real browser (headless chromium).

One ``opstate serve`` process (SQLite in a temporary directory, its API token generated into
the token file, a Gemini API key pointing at the fake Gemini server) for the module; the page is
opened with the link ``serve`` prints, as printed. Webhooks are signed with
``standardwebhooks`` at the current time, as Gemini would.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from tests.browser.conftest import ARTIFACTS, missing
from tests.support.prerequisites import in_ci

# One line for the whole module when the browser or playwright is missing; an error under CI.
_LACKING = missing()
if _LACKING is not None:
    if in_ci():
        pytest.fail(f"browser tests under CI need {_LACKING}", pytrace=False)
    pytest.skip(f"browser tests need {_LACKING}", allow_module_level=True)

from playwright.sync_api import expect  # noqa: E402

from tests.support.fake_gemini import FakeGemini  # noqa: E402
from tests.support.serve_process import (  # noqa: E402
    ServeProcess,
    http,
    start_serve,
)

SECRET = "whsec_" + base64.b64encode(b"opstate-browser-test-secret-32by").decode()
# The page polls every second; the bound for a webhook to show up without a reload.
APPEARS_WITHIN_MS = 2000


@pytest.fixture(scope="module")
def fake_gemini() -> Iterator[FakeGemini]:
    fake = FakeGemini().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve")


@pytest.fixture(scope="module")
def server(home: Path, chromium: Any, fake_gemini: FakeGemini) -> Iterator[ServeProcess]:
    proc = start_serve(
        # One reconciler pass at the start (nothing to do then), none during the tests.
        ["--store", f"sqlite:///{home / 'ops.db'}", "--reconcile-every", "3600"],
        cwd=home,
        env={
            "OPSTATE_WEBHOOK_SECRETS": SECRET,
            "OPSTATE_API_TOKEN": None,  # generated into .opstate/api-token, as for a newcomer
            "GEMINI_API_KEY": "test-key",
            "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url,
        },
    )
    try:
        # That first pass done before any test reports a record: a pass that a loaded machine
        # delays would otherwise poll (and discover) what a test expects its click to poll.
        proc.wait_for_line(r"reconcile: \w+=", timeout=120)
        yield proc
    finally:
        proc.terminate()


@pytest.fixture(scope="module")
def token(home: Path, server: ServeProcess) -> str:
    return (home / ".opstate" / "api-token").read_text().strip()


@pytest.fixture(scope="module")
def page_url(server: ServeProcess, token: str) -> str:
    """The page link exactly as serve prints it: the token in its fragment."""
    line = server.wait_for_line(r"^operations page: http://\S+")
    printed = line.split(": ", 1)[1].strip()
    assert printed == f"{server.url}/#token={token}"
    return printed


def webhook(server: ServeProcess, event_type: str, name: str, when: str, **data: Any) -> dict:
    raw = json.dumps(
        {"type": event_type, "version": "v1", "timestamp": when, "data": {"id": name, **data}}
    )
    msg_id = f"msg_{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(msg_id, now, raw),
    }
    status, _, body = http("POST", f"{server.url}/gemini/webhook", raw.encode(), headers)
    assert status == 200, body
    return dict(body)


def redeliver(server: ServeProcess, raw_event: tuple[str, str, str, dict[str, Any]]) -> dict:
    event_type, name, when, data = raw_event
    return webhook(server, event_type, name, when, **data)


def report(server: ServeProcess, token: str, name: str, state: str, when: str) -> None:
    body = json.dumps({"state": state, "updateTime": when}).encode()
    headers = {"content-type": "application/json"}
    status, _, answer = http("PUT", f"{server.url}/operations/{name}", body, headers, token=token)
    assert status == 200, answer


def rows(page: Any) -> list[str]:
    return [
        str(n) for n in page.locator("#rows tr").evaluate_all("r => r.map(x => x.dataset.name)")
    ]


def open_page(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#status:has-text('Live')")


def test_the_printed_link_opens_the_page_and_the_token_never_goes_into_a_url(
    page: Any, page_url: str, token: str
) -> None:
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    open_page(page, page_url)  # the link as printed: no paste, no prompt
    assert page.locator("#token-form").is_hidden()
    assert page.title() == "opstate · operations"
    assert "token" not in page.url  # taken from the fragment, kept in sessionStorage
    assert requested and all(token not in url for url in requested), requested
    headers = [h.strip() for h in page.locator("#operations thead th").all_inner_texts()]
    assert headers == ["Name", "Kind", "State", "Version", "Last server time", "Age"]


def test_without_a_valid_token_the_page_asks_for_one_and_shows_no_data(
    page: Any, server: ServeProcess, page_url: str, home: Path
) -> None:
    webhook(server, "batch.succeeded", "batches/secret-one", "2026-11-30T10:00:00Z")
    page.goto(server.url + "/#token=not-the-token")
    page.wait_for_selector("#token-form:not([hidden])")
    assert page.locator("#main").is_hidden()
    assert "secret-one" not in page.content()
    # It says where the token is, and no longer that serve printed it.
    token_file = str((home / ".opstate" / "api-token").resolve())
    expect(page.locator("#token-where")).to_contain_text(f"in the file {token_file}")
    assert "printed by" not in page.locator("#token-form").inner_text()
    # Pasting the right token shows the data.
    page.fill("#token-input", page_url.split("#token=", 1)[1])
    page.keyboard.press("Enter")
    page.wait_for_selector("tr[data-name='batches/secret-one']")


def test_a_signed_webhook_appears_without_a_reload(
    page: Any, server: ServeProcess, page_url: str
) -> None:
    open_page(page, page_url)
    page.evaluate("window.__sameDocument = true")
    webhook(
        server,
        "batch.succeeded",
        "batches/live-1",
        "2026-11-30T11:00:00Z",
        output_file_uri="files/o1",
    )
    row = page.locator("tr[data-name='batches/live-1']")
    row.wait_for(timeout=APPEARS_WITHIN_MS)
    assert page.evaluate("window.__sameDocument") is True  # no navigation happened
    assert row.locator(".badge").inner_text() == "SUCCEEDED"
    assert row.locator("td").nth(4).inner_text() == "2026-11-30 11:00:00Z"


def test_filters_and_search(page: Any, server: ServeProcess, token: str, page_url: str) -> None:
    report(server, token, "batches/filter-pending", "PENDING", "2026-11-30T08:00:00Z")
    report(server, token, "batches/filter-running", "RUNNING", "2026-11-30T08:01:00Z")
    webhook(server, "batch.failed", "batches/filter-failed", "2026-11-30T08:02:00Z", error_code=3)
    webhook(server, "interaction.requires_action", "interactions/filter-ia", "2026-11-30T08:03:00Z")
    open_page(page, page_url)
    page.wait_for_selector("tr[data-name='interactions/filter-ia']")

    page.select_option("#filter-state", "FAILED")
    assert set(rows(page)) == {"batches/filter-failed"}
    page.select_option("#filter-state", "")

    page.select_option("#filter-kind", "interaction")
    assert rows(page) == ["interactions/filter-ia"]
    page.select_option("#filter-kind", "")

    page.select_option("#filter-open", "open")
    shown = set(rows(page))
    assert {"batches/filter-pending", "batches/filter-running", "interactions/filter-ia"} <= shown
    assert "batches/filter-failed" not in shown and "batches/live-1" not in shown
    page.select_option("#filter-open", "terminal")
    assert "batches/filter-failed" in rows(page) and "batches/filter-running" not in rows(page)
    page.select_option("#filter-open", "")

    page.fill("#search", "FILTER-RUN")  # case-insensitive substring of the name
    assert rows(page) == ["batches/filter-running"]
    assert page.locator("#count").inner_text().startswith("1 of ")
    page.fill("#search", "no-such-operation")
    assert rows(page) == [] and page.locator("#empty").is_visible()
    page.click("#clear-filters")
    expect(page.locator("tr[data-name='batches/filter-failed']")).to_be_visible()
    assert page.locator("#search").input_value() == ""


@pytest.fixture(scope="module")
def stale_one(server: ServeProcess) -> str:
    """batches/stale-1: a delivery and Gemini's retry of it (dropped as stale), once."""
    delivery = (
        "batch.succeeded",
        "batches/stale-1",
        "2026-11-30T12:00:00Z",
        {"output_file_uri": "files/stale-out"},
    )
    assert redeliver(server, delivery)["applied"] is True
    again = redeliver(server, delivery)  # Gemini retries the same event
    assert (again["applied"], again["reason"]) == (False, "stale-or-equal-update-time")
    return "batches/stale-1"


def test_detail_view_shows_details_and_the_drop_reason_of_a_stale_redelivery(
    page: Any, page_url: str, stale_one: str
) -> None:
    open_page(page, page_url)
    page.get_by_role("button", name="Show batches/stale-1").click()
    detail = page.locator("#detail")
    detail.wait_for()
    assert page.locator("#detail-title").inner_text() == "batches/stale-1"
    assert json.loads(page.locator("#detail-json").inner_text()) == {
        "output_file_uri": "files/stale-out"
    }
    decisions = page.locator("#decision-rows tr")
    assert decisions.count() == 2
    newest = decisions.nth(0).locator("td").all_inner_texts()
    assert newest[1:5] == ["dropped", "stale-or-equal-update-time", "SUCCEEDED", "webhook"]
    oldest = decisions.nth(1).locator("td").all_inner_texts()
    assert oldest[1:3] == ["applied", "created"]


def test_keyboard_only(page: Any, page_url: str, stale_one: str) -> None:
    open_page(page, page_url)
    page.wait_for_selector("tr[data-name='batches/stale-1']")
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "search"
    page.keyboard.type("stale-1")
    page.keyboard.press("Tab")  # state
    page.keyboard.press("Tab")  # kind
    page.keyboard.press("Tab")  # open/terminal
    page.keyboard.press("Tab")  # clear
    page.keyboard.press("Tab")  # the first operation's name
    assert page.evaluate("document.activeElement.textContent") == "batches/stale-1"
    page.keyboard.press("Enter")
    expect(page.locator("#detail")).to_be_focused()
    page.keyboard.press("Escape")
    page.wait_for_selector("#detail", state="hidden")
    assert page.evaluate("document.activeElement.textContent") == "batches/stale-1"


def test_the_poll_now_button_polls_gemini_through_ingest(
    page: Any, server: ServeProcess, token: str, page_url: str, fake_gemini: FakeGemini
) -> None:
    name = "batches/refresh-me"
    report(server, token, name, "PENDING", "2026-11-30T09:00:00Z")
    fake_gemini.put_batch(name, "BATCH_STATE_RUNNING", update_time="2026-11-30T09:05:00Z")
    open_page(page, page_url)
    page.get_by_role("button", name=f"Show {name}").click()
    page.locator("#detail").wait_for()
    button = page.get_by_role("button", name="Poll Gemini now")
    expect(button).to_be_enabled()
    button.click()
    result = page.locator("#refresh-result")
    expect(result).to_have_text(f"{name}: advanced, now RUNNING (version 2)")
    assert fake_gemini.hits(name) == 1
    # The record and the page moved on: the row's badge and the decision, from the poll.
    row = page.locator(f"tr[data-name='{name}']")
    expect(row.locator(".badge")).to_have_text("RUNNING", timeout=APPEARS_WITHIN_MS)
    newest = page.locator("#decision-rows tr").nth(0).locator("td").all_inner_texts()
    assert newest[1:5] == ["applied", "advanced", "RUNNING", "poll"]
    status, _, record = http("GET", f"{server.url}/operations/{name}", token=token)
    assert (status, record["state"], record["source"]) == (200, "RUNNING", "poll")
    # The same answer again: dropped, said so, nothing written.
    button.click()
    expect(result).to_have_text(
        f"{name}: dropped (stale-or-equal-update-time), stays RUNNING (version 2)"
    )
    server.wait_for_line(rf"{name}  PENDING -> RUNNING  v2  \(poll\)")


def test_the_poll_now_route_needs_the_token_and_a_post(server: ServeProcess, token: str) -> None:
    url = f"{server.url}/ui/api/refresh?name=batches/refresh-me"
    assert http("POST", url, b"", token=None)[0] == 401
    assert http("POST", url, b"", token="wrong-token-wrong-token-wrong-token")[0] == 401
    assert http("GET", url, token=token)[0] == 405
    status, _, body = http("POST", url.replace("refresh-me", "never-tracked"), b"", token=token)
    assert (status, body["error"]) == (404, "not-found")


def test_the_docs_screenshot_script_shows_every_state_and_the_stored_video_key(
    chromium: Any,
) -> None:
    """``scripts/operations_page_screenshot.py`` (what made docs/img/operations-page.png): its
    own server, a record per state, the video under the key the store uses, a stale
    redelivery's drop open in the detail."""
    from scripts.operations_page_screenshot import take_screenshot

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "operations-page.png"
    shown = take_screenshot(shot, context=chromium)
    assert shot.stat().st_size > 10_000
    states = {state for _, state in shown.rows}
    assert states == {"PENDING", "RUNNING", "REQUIRES_ACTION", "SUCCEEDED", "FAILED", "CANCELLED"}
    names = [name for name, _ in shown.rows]
    assert any(n.startswith("models/-/operations/") for n in names), names
    assert not any(n.startswith("models/veo") for n in names), names
    assert shown.detail_reasons[:2] == ["stale-or-equal-update-time", "created"]


def _luminance(rgb: str) -> float:
    r, g, b = (int(x) / 255 for x in re.findall(r"\d+", rgb)[:3])

    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(fg: str, bg: str) -> float:
    lighter, darker = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def test_text_contrast_meets_wcag_aa(page: Any, page_url: str, stale_one: str) -> None:
    open_page(page, page_url)
    page.get_by_role("button", name="Show batches/stale-1").click()
    page.locator("#detail").wait_for()
    pairs = page.evaluate(
        """() => {
          const out = [];
          const bg = (el) => {
            for (let e = el; e; e = e.parentElement) {
              const c = getComputedStyle(e).backgroundColor;
              if (c && c !== 'rgba(0, 0, 0, 0)' && c !== 'transparent') return c;
            }
            return 'rgb(255, 255, 255)';
          };
          const sel = '.badge, td, th, label, #status, #count, .op-link, dt, dd, h1, h2, h3';
          for (const el of document.querySelectorAll(sel)) {
            if (!el.offsetParent || !el.textContent.trim()) continue;
            out.push([el.className + ' ' + el.textContent.trim().slice(0, 30),
                      getComputedStyle(el).color, bg(el)]);
          }
          return out;
        }"""
    )
    assert len(pairs) > 40
    low = [(what, round(contrast(fg, bg), 2)) for what, fg, bg in pairs if contrast(fg, bg) < 4.5]
    assert not low, low
