"""The operations page shows a running batch's progress as a progress bar, and a finished
one's archive status and ledger (rows, errors by code, tokens), in Chromium."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.store.port import ArchiveState
from opstate.store.sqlite import SQLiteStore
from tests.browser.conftest import missing
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


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, chromium: Any
) -> Iterator[tuple[ServeProcess, Path]]:
    home = tmp_path_factory.mktemp("serve-results")
    db = home / "ops.db"
    proc = start_serve(["--store", f"sqlite:///{db}"], cwd=home, env={})
    try:
        yield proc, db
    finally:
        proc.terminate()


def report(server: ServeProcess, name: str, body: dict[str, Any]) -> None:
    headers = {"content-type": "application/json"}
    status, _, answer = http(
        "PUT",
        f"{server.url}/operations/{name}",
        json.dumps(body).encode(),
        headers,
        token=TEST_API_TOKEN,
    )
    assert status == 200, answer


def test_progress_bar_and_ledger(page: Any, served: tuple[ServeProcess, Path]) -> None:
    server, db = served
    stats = {
        "requestCount": 200,
        "successfulRequestCount": 120,
        "failedRequestCount": 30,
        "pendingRequestCount": 50,
    }
    report(server, "batches/running-1", {"state": "RUNNING", "details": {"batch_stats": stats}})
    report(server, "batches/done-1", {"state": "SUCCEEDED"})
    report(server, "batches/done-2", {"state": "SUCCEEDED"})
    store = SQLiteStore(db)
    try:
        record = store.get("batches/done-1")
        assert record is not None
        # done-1 as the release before blocked rows were counted archived it (no "blocked")
        summary = {
            "objects": [
                {
                    "location": "file:///r/batches/done-1/1/output.jsonl",
                    "bytes": 4096,
                    "sha256": "ab" * 32,
                }
            ],
            "rows": {"total": 10, "succeeded": 7, "failed": 2, "unreadable": 1},
            "errors": {"429": 2},
            "usage": {
                "promptTokenCount": 100,
                "candidatesTokenCount": 50,
                "thoughtsTokenCount": 5,
                "cachedContentTokenCount": 0,
                "toolUsePromptTokenCount": 0,
                "totalTokenCount": 155,
            },
            "requests": 10,
        }
        archived = ArchiveState(
            "archived",
            created_ns=record.created_ns,
            deadline_ns=record.applied_ns + 48 * 3600 * 10**9,
            archived_ns=record.applied_ns,
            location="file:///r/batches/done-1/1/summary.json",
            summary=summary,
        )
        assert store.set_archive("batches/done-1", 0, archived)
        rows = {"total": 10, "succeeded": 7, "blocked": 3, "failed": 2, "unreadable": 1}
        later = store.get("batches/done-2")
        assert later is not None
        archived = ArchiveState(
            "archived",
            created_ns=later.created_ns,
            deadline_ns=later.applied_ns + 48 * 3600 * 10**9,
            archived_ns=later.applied_ns,
            location="file:///r/batches/done-2/1/summary.json",
            summary={**summary, "rows": rows},
        )
        assert store.set_archive("batches/done-2", 0, archived)
    finally:
        store.close()
    page.goto(f"{server.url}/#token={TEST_API_TOKEN}")
    page.wait_for_selector("#status:has-text('Live')")
    page.get_by_role("button", name="Show batches/running-1").click()
    bar = page.locator("#detail-progress")
    bar.wait_for()
    assert bar.evaluate("b => [b.value, b.max]") == [150, 200]
    assert "150 of 200 done (30 failed)" in page.locator("#detail-fields").inner_text()
    page.get_by_role("button", name="Show batches/done-1").click()
    page.wait_for_selector("#detail-title:has-text('batches/done-1')")
    fields = page.locator("#detail-fields")
    fields.locator("text=Rows").wait_for()
    text = fields.inner_text()
    assert "archived" in text
    assert "7 succeeded, 2 failed, 1 unreadable of 10 (10 requests)" in text
    assert "429: 2" in text
    assert "155 total (100 prompt, 50 output, 5 thinking, 0 cached)" in text
    # an archive without a price (written as the previous release wrote it): unknown, never $0
    assert "Cost\nunknown: archived by an earlier release, which did not price results" in text
    assert "file:///r/batches/done-1/1/output.jsonl (4096 bytes)" in text
    assert page.locator("#detail-progress").count() == 0
    page.get_by_role("button", name="Show batches/done-2").click()
    page.wait_for_selector("#detail-title:has-text('batches/done-2')")
    fields.locator("text=Rows").wait_for()
    assert "7 succeeded (3 blocked), 2 failed, 1 unreadable of 10 (10 requests)" in (
        fields.inner_text()
    )
