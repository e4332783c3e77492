"""``opstate wait NAME --until final`` (issue 33) on an SQLite store: waits past a FAILED root
while its retries are active, returns 0 once another writer stores the final result, and is
``--until archived`` for an operation without retries."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from opstate.cli import main
from opstate.config import settings
from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.ingest import ingest
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RetryState
from opstate.store.sqlite import SQLiteStore
from opstate.waiters import wiring

NAME = "batches/wait-final"
T0 = parse_time("2026-05-10T09:00:00Z")
FINAL_URI = "file:///results/batches/wait-final/final.jsonl"


def doc(final: str) -> dict[str, Any]:
    return {
        "policy": {"maxAttempts": 2, "resubmitExpired": False, "pendingTimeoutHours": None},
        "children": [],
        "final": {
            "status": final,
            "location": FINAL_URI if final == "final" else None,
            "rows": {"total": 4, "answered": 4, "blocked": 0, "failed": 0},
            "errors": {},
            "retried": 2,
            "attempts": 2,
        },
    }


def _wait(*args: str) -> int:
    settings.cache_clear()
    try:
        return main(["wait", NAME, *args, "--store", "sqlite:///ops.db"])
    finally:
        settings.cache_clear()


@pytest.fixture
def failed_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SQLiteStore:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(wiring, "RESULTS_JSON", lambda store, name: {"status": "archived"})
    store = SQLiteStore(tmp_path / "ops.db")
    ingest(store, OpEvent(NAME, State.FAILED, T0, "report", {}), clock_ns=lambda: T0)
    return store


def test_wait_until_final_outlasts_a_failed_root_until_the_final_result_is_written(
    failed_root: SQLiteStore, capsys: pytest.CaptureFixture[str]
) -> None:
    record = failed_root.get(NAME)
    assert record is not None
    assert failed_root.set_retry(
        NAME, 0, RetryState(RETRY_ACTIVE, record.created_ns, 0, T0, doc("pending"))
    )
    assert _wait("--until", "final", "--timeout", "0.5") == 124  # FAILED, retries active
    capsys.readouterr()
    final = RetryState(RETRY_DONE, record.created_ns, 0, 0, doc("final"))
    timer = threading.Timer(0.6, lambda: failed_root.set_retry(NAME, 1, final))
    timer.start()
    try:
        code = _wait("--until", "final", "--timeout", "20")
    finally:
        timer.cancel()
    printed = capsys.readouterr()
    assert code == 0, printed.err
    lines = printed.out.splitlines()
    block = lines[lines.index("final") + 1 :]  # the text view: one indented line per field
    assert block[0].split() == ["status", "final"]
    assert ["location", FINAL_URI] in [row.split() for row in block]
    assert "state" in printed.out and "FAILED" in printed.out


def test_without_retries_final_is_archived(
    failed_root: SQLiteStore, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _wait("--until", "final", "--timeout", "5") == 1  # FAILED and archived
    assert "ended FAILED" in capsys.readouterr().err
    assert _wait("--until", "archived", "--timeout", "5") == 1


def test_final_needs_archiving_in_the_build(
    failed_root: SQLiteStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(wiring, "RESULTS_JSON", None)
    assert _wait("--until", "final") == 2
    assert "--until final: results archiving is not available" in capsys.readouterr().err
