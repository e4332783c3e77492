"""The operations page shows retries (issue 33, docs/retry.md) in Chromium: a root's retry
status, its retry batches (each a name that opens its own view) and its final counts; a child's
lineage (root and parent open theirs); a reason or a name holding markup shown as text."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RETRY_MEMBER, RetryState
from opstate.store.sqlite import SQLiteStore
from tests.browser.conftest import ARTIFACTS, missing
from tests.support.prerequisites import in_ci
from tests.support.serve_process import (
    TEST_API_TOKEN,
    ServeProcess,
    http,
    start_serve,
)

# One line for the whole module when the browser or playwright is missing; an error under CI.
_LACKING = missing()
if _LACKING is not None:
    if in_ci():
        pytest.fail(f"browser tests under CI need {_LACKING}", pytrace=False)
    pytest.skip(f"browser tests need {_LACKING}", allow_module_level=True)

ROOT = "batches/retry-root"
CHILD = "batches/retry-child-1"
FINAL_ROOT = "batches/retry-final"
BROKEN_ROOT = "batches/retry-broken"
STOPPED_ROOT = "batches/retry-stopped"
MARKUP = '<img src=x onerror="window.pwned=1"><b>bold</b>'
POLICY = {"maxAttempts": 2, "resubmitExpired": False, "pendingTimeoutHours": None}
# Far ahead: serve's own retry pass never takes these roots (it looks at due roots only).
LATER_NS = time.time_ns() + 86400 * 10**9


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, chromium: Any
) -> Iterator[tuple[ServeProcess, Path]]:
    home = tmp_path_factory.mktemp("serve-retry")
    db = home / "ops.db"
    proc = start_serve(["--store", f"sqlite:///{db}"], cwd=home, env={})
    try:
        yield proc, db
    finally:
        proc.terminate()


def report(server: ServeProcess, name: str, state: str) -> None:
    status, _, answer = http(
        "PUT",
        f"{server.url}/operations/{name}",
        json.dumps({"state": state}).encode(),
        {"content-type": "application/json"},
        token=TEST_API_TOKEN,
    )
    assert status == 200, answer


def child(index: int, name: str | None, phase: str, rows: int) -> dict[str, Any]:
    return {
        "id": f"opstate-0123456789ab-a1-{index}",
        "attempt": 1,
        "parent": ROOT,
        "name": name,
        "rows": rows,
        "input": f"file:///r/{ROOT}/retry/opstate-0123456789ab-a1-{index}.jsonl",
        "whole": False,
        "phase": phase,
        "claims": 0,
        "claimUntilNs": 0,
        "error": None,
    }


def keep(db: Path, name: str, status: str, doc: dict[str, Any]) -> None:
    store = SQLiteStore(db)
    try:
        record = store.get(name)
        assert record is not None
        due = LATER_NS if status == RETRY_ACTIVE else 0
        state = RetryState(status, created_ns=record.created_ns, due_ns=due, doc=doc)
        assert store.set_retry(name, 0, state)
    finally:
        store.close()


@pytest.fixture(scope="module")
def lineage(served: tuple[ServeProcess, Path]) -> ServeProcess:
    server, db = served
    for name in (ROOT, FINAL_ROOT, BROKEN_ROOT, STOPPED_ROOT):
        report(server, name, "SUCCEEDED")
    report(server, CHILD, "RUNNING")
    keep(
        db,
        ROOT,
        RETRY_ACTIVE,
        {
            "policy": POLICY,
            "input": {"location": "file:///r/inputs/ab/input.jsonl"},
            "children": [child(0, CHILD, "created", 10), child(1, None, "planned", 4)],
            "final": {"status": "pending"},
        },
    )
    keep(
        db,
        CHILD,
        RETRY_MEMBER,
        {
            "lineage": {
                "root": ROOT,
                "parent": ROOT,
                "attempt": 1,
                "id": "opstate-0123456789ab-a1-0",
            }
        },
    )
    keep(
        db,
        FINAL_ROOT,
        RETRY_DONE,
        {
            "policy": POLICY,
            "children": [],
            "final": {
                "status": "final",
                "location": "file:///r/batches/retry-final/final.jsonl",
                "rows": {"total": 100, "answered": 93, "blocked": 2, "failed": 7},
                "errors": {"400": 5, "429": 2},
                "retried": 12,
                "attempts": 3,
            },
        },
    )
    keep(
        db,
        BROKEN_ROOT,
        RETRY_DONE,
        {
            "policy": POLICY,
            "unavailable": f"no input held {MARKUP}",
            "children": [child(0, f"batches/{MARKUP}", "created", 3)],
        },
    )
    keep(
        db,
        STOPPED_ROOT,
        RETRY_DONE,
        {"policy": POLICY, "stopped": "create refused: quota exceeded", "children": []},
    )
    return server


def open_detail(page: Any, server: ServeProcess, name: str) -> Any:
    page.goto(f"{server.url}/#token={TEST_API_TOKEN}")
    page.wait_for_selector("#status:has-text('Live')")
    page.locator("#rows").get_by_role("button", name=f"Show {name}").click()
    page.wait_for_selector(f"#detail-title:has-text('{name}')")
    return page.locator("#detail-fields")


def test_a_root_shows_its_status_and_retry_batches_which_open(
    page: Any, lineage: ServeProcess
) -> None:
    fields = open_detail(page, lineage, ROOT)
    fields.locator("text=Retry batches").wait_for()
    text = fields.inner_text()
    assert "active" in text
    assert "2 retries per key, resubmit expired: no, pending timeout: off" in text
    assert f"{CHILD} · attempt 1 · created · 10 rows" in text
    assert "(not created yet) · attempt 1 · planned · 4 rows" in text
    assert "file:///r/inputs/ab/input.jsonl" in text
    assert "Final result\npending" in text
    assert "Final rows" not in text
    fields.get_by_role("button", name=f"Show {CHILD}").click()
    page.wait_for_selector(f"#detail-title:has-text('{CHILD}')")
    fields.locator("text=Retry of").wait_for()
    assert f"attempt 1 of root {ROOT}, parent {ROOT}" in fields.inner_text()
    assert "Retry batches" not in fields.inner_text()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#detail").screenshot(path=str(ARTIFACTS / "retry-child.png"))
    # the child's root opens the root again
    fields.get_by_role("button", name=f"Show {ROOT}").first.click()
    page.wait_for_selector(f"#detail-title:has-text('{ROOT}')")
    fields.locator("text=Retry batches").wait_for()


def test_a_final_root_shows_its_counts_and_where_final_jsonl_is(
    page: Any, lineage: ServeProcess
) -> None:
    fields = open_detail(page, lineage, FINAL_ROOT)
    fields.locator("text=Final rows").wait_for()
    text = fields.inner_text()
    assert "final" in fields.locator(".badge.retry-final").inner_text()
    assert "100 total: 93 answered (2 blocked), 7 failed" in text
    assert "400: 5, 429: 2" in text
    assert "Attempts\n3" in text
    assert "Lineage cost\nunknown: written by an earlier release" in text
    assert "file:///r/batches/retry-final/final.jsonl" in text
    assert "Retry batches\nnone yet" in text
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#detail").screenshot(path=str(ARTIFACTS / "retry-final.png"))


def test_unavailable_and_stopped_show_their_reasons_as_text(
    page: Any, lineage: ServeProcess
) -> None:
    fields = open_detail(page, lineage, BROKEN_ROOT)
    fields.locator("text=Retry batches").wait_for()
    text = fields.inner_text()
    assert fields.locator(".badge.retry-unavailable").inner_text() == "unavailable"
    assert f"no input held {MARKUP}" in text
    assert f"batches/{MARKUP} · attempt 1 · created · 3 rows" in text
    # the markup is text: no element was made of it, no script ran
    assert page.locator("#detail img, #detail b").count() == 0
    assert page.evaluate("window.pwned") is None
    fields = open_detail(page, lineage, STOPPED_ROOT)
    fields.locator(".badge.retry-stopped").wait_for()
    assert "stopped create refused: quota exceeded" in fields.inner_text()


def test_a_record_without_a_retry_state_shows_none(page: Any, lineage: ServeProcess) -> None:
    report(lineage, "batches/plain-1", "SUCCEEDED")
    fields = open_detail(page, lineage, "batches/plain-1")
    fields.locator("text=State").first.wait_for()
    text = fields.inner_text()
    assert "Retry" not in text and "Final" not in text
