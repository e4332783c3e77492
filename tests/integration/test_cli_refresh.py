"""``opstate reconcile --once`` when every request failed, a running batch's progress after
it (listed or polled), and ``opstate refresh NAME``.

In-process through ``main``, on the embedded SQLite store, against the real google-genai client
talking to the fake Gemini server (``tests/support/fake_gemini.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from opstate.cli.common import EXIT_FAILURE, EXIT_OK
from opstate.config import settings
from opstate.store import PollState
from opstate.store.sqlite import SQLiteStore
from tests.support.cli import Result, in_process
from tests.support.fake_gemini import FakeGemini

T1 = "2026-05-10T10:00:00Z"
T2 = "2026-05-10T11:00:00Z"
FAR_FUTURE_NS = 4_000_000_000 * 10**9


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys, fake_gemini):
    """``main(argv)`` in tmp_path, with a Gemini key pointing at the fake server."""
    monkeypatch.chdir(tmp_path)
    for key in ("OPSTATE_STORE", "OPSTATE_TABLE_NAME", "OPSTATE_WEBHOOK_SECRETS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    monkeypatch.setenv("OPSTATE_RECONCILE_MAX_PAGES", "0")  # no discovery: only the polls

    yield in_process(monkeypatch, capsys)
    settings.cache_clear()


def error_lines(result: Result) -> list[str]:
    """The command's own verdict lines (the library's log lines are ``opstate:`` lines too,
    one per failed poll, since issue 49)."""
    verdicts = ("opstate: error: ", "opstate: warning: ")
    return [line for line in result.err.splitlines() if line.startswith(verdicts)]


# --- reconcile --once: no useful work because of errors is a failure ------------------------------


def test_a_pass_where_every_poll_failed_exits_1_with_the_first_error(cli, fake_gemini):
    for i in range(3):
        assert cli("track", f"batches/denied-{i}").code == EXIT_OK
        fake_gemini.fail(f"batches/denied-{i}", 403, message="API key not valid")
    result = cli("reconcile", "--once")
    assert result.code == EXIT_FAILURE, result.err
    run = result.json()  # the JSON result is still printed
    assert (run["errors"], run["applied"], run["polled"]) == (3, 0, 3)
    lines = error_lines(result)
    assert len(lines) == 1, result.err
    assert lines[0].startswith(
        "opstate: error: the pass did no useful work: 3 error(s); the first: "
    )
    assert "poll failed for batches/denied-" in lines[0]
    assert "(HTTP 403): PERMISSION_DENIED: API key not valid" in lines[0]


def test_a_pass_with_some_errors_and_some_answers_exits_0_and_says_the_first(cli, fake_gemini):
    assert cli("track", "batches/fine").code == EXIT_OK
    fake_gemini.put_batch("batches/fine", "BATCH_STATE_RUNNING", update_time=T1)
    assert cli("track", "batches/denied").code == EXIT_OK
    fake_gemini.fail("batches/denied", 403, message="no access")
    result = cli("reconcile", "--once")
    assert result.code == EXIT_OK, result.err
    assert (result.json()["errors"], result.json()["applied"]) == (1, 1)
    assert error_lines(result) == [
        "opstate: warning: 1 error(s) in the pass; the first: "
        "poll failed for batches/denied (HTTP 403): PERMISSION_DENIED: no access"
    ]


def test_a_pass_with_nothing_to_do_and_no_error_exits_0_quietly(cli):
    result = cli("reconcile", "--once")
    assert result.code == EXIT_OK, result.err
    assert error_lines(result) == []


# --- reconcile --once keeps a running batch's progress, listed or polled (issue 31) ---------------


@pytest.mark.parametrize("pages", ["5", "0"])  # discovery lists it first (the default), or off
def test_a_running_batch_shows_its_progress_after_a_pass(
    cli: Callable[..., Result],
    fake_gemini: FakeGemini,
    monkeypatch: pytest.MonkeyPatch,
    pages: str,
) -> None:
    monkeypatch.setenv("OPSTATE_RECONCILE_MAX_PAGES", pages)
    fake_gemini.put_batch("batches/run", "BATCH_STATE_RUNNING", update_time=T1)
    body = fake_gemini.resource("batches/run") or {}
    body["metadata"]["batchStats"] = {
        "requestCount": "100",
        "successfulRequestCount": "40",
        "failedRequestCount": "2",
        "pendingRequestCount": "58",
    }
    fake_gemini.put("batches/run", body)
    assert cli("report", "batches/run", "RUNNING", "--time", T1).code == EXIT_OK
    run = cli("reconcile", "--once").json()
    assert (run["discovered"], run["polled"], run["errors"]) == (
        (1, 0, 0) if pages == "5" else (0, 1, 0)
    )
    got = cli("get", "batches/run", "--json").json()
    assert (got["state"], got["version"]) == ("RUNNING", 1)  # the same answer: dropped...
    assert got["progress"] == {
        "requestCount": 100,
        "successfulRequestCount": 40,
        "failedRequestCount": 2,
        "pendingRequestCount": 58,
    }  # ...its progress kept


# --- refresh NAME ---------------------------------------------------------------------------------


def not_due(tmp_path: Path, name: str) -> None:
    """Push ``name``'s next poll far into the future: a reconciler pass would skip it."""
    store = SQLiteStore(tmp_path / ".opstate" / "ops.db")
    try:
        record = store.get(name)
        assert record is not None
        assert store.set_poll(name, record.version, PollState(due_ns=FAR_FUTURE_NS))
    finally:
        store.close()


def test_refresh_polls_one_operation_now_and_prints_its_decision(cli, fake_gemini, tmp_path):
    assert cli("track", "batches/r1").code == EXIT_OK
    not_due(tmp_path, "batches/r1")
    fake_gemini.put_batch("batches/r1", "BATCH_STATE_RUNNING", update_time=T1)
    # Not due: a pass does not poll it ...
    assert cli("reconcile", "--once").json()["polled"] == 0
    assert fake_gemini.hits("batches/r1") == 0
    # ... refresh does, once, through ingest.
    result = cli("refresh", "v1beta/batches/r1")
    assert (result.code, result.err) == (EXIT_OK, "")
    assert result.out.strip() == "batches/r1: advanced, now RUNNING (version 2)"
    assert fake_gemini.hits("batches/r1") == 1
    got = json.loads(cli("get", "batches/r1", "--json").out)
    assert (got["state"], got["source"], got["version"]) == ("RUNNING", "poll", 2)

    # The same answer again: dropped, nothing written.
    again = cli("refresh", "batches/r1")
    assert again.out.strip() == (
        "batches/r1: dropped (stale-or-equal-update-time), stays RUNNING (version 2)"
    )
    fake_gemini.put_batch("batches/r1", "BATCH_STATE_SUCCEEDED", update_time=T2)
    done = cli("refresh", "batches/r1", "--json")
    assert done.code == EXIT_OK
    assert done.json() == {
        "name": "batches/r1",
        "found": True,
        "applied": True,
        "reason": "advanced",
        "state": "SUCCEEDED",
        "version": 3,
        "error": None,
    }


def test_refresh_leaves_the_poll_schedule_alone(cli, fake_gemini, tmp_path):
    assert cli("track", "batches/r2").code == EXIT_OK
    not_due(tmp_path, "batches/r2")
    fake_gemini.put_batch("batches/r2", "BATCH_STATE_RUNNING", update_time=T1)
    assert cli("refresh", "batches/r2").code == EXIT_OK
    store = SQLiteStore(tmp_path / ".opstate" / "ops.db")
    try:
        due = {d.record.name: d.poll for d in store.iter_due(None)}
    finally:
        store.close()
    assert due["batches/r2"].due_ns == FAR_FUTURE_NS  # an applied ingest keeps due_ns


def test_refresh_of_an_operation_gemini_does_not_know(cli, fake_gemini):
    assert cli("track", "batches/unknown-here").code == EXIT_OK
    result = cli("refresh", "batches/unknown-here")
    assert result.code == EXIT_OK, result.err
    assert result.out.strip() == (
        "batches/unknown-here: Gemini answered 404 (not found); the record is kept, "
        "stays PENDING (version 1)"
    )


def test_refresh_that_fails_says_why_and_exits_1(cli, fake_gemini):
    assert cli("track", "batches/r3").code == EXIT_OK
    fake_gemini.fail("batches/r3", 403, message="API key not valid")
    result = cli("refresh", "batches/r3")
    assert result.code == EXIT_FAILURE
    assert result.out.strip() == (
        "batches/r3: not refreshed, stays PENDING (version 1): "
        "poll failed for batches/r3 (HTTP 403): PERMISSION_DENIED: API key not valid"
    )


def test_refresh_of_an_untracked_name_or_without_a_key_is_one_sentence(cli, monkeypatch):
    assert cli("track", "batches/other").code == 0  # the store exists (else: no store at ...)
    result = cli("refresh", "batches/never-tracked")
    assert result.code == EXIT_FAILURE
    assert result.err.strip() == (
        "opstate: error: no record for batches/never-tracked in sqlite:///.opstate/ops.db: "
        "track it first (opstate track batches/never-tracked)"
    )
    monkeypatch.delenv("GEMINI_API_KEY")
    result = cli("refresh", "batches/never-tracked")
    assert result.code == EXIT_FAILURE
    assert "no Gemini API key" in result.err
