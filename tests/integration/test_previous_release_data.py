"""Stored data the previous release (a09a393, before issue 33's retry slot) wrote with its own
code, opened by this one: tests/fixtures/previous_release/ (make_fixture.py says how it was
made and reproduces it). ``views.json`` is what that release's ``opstate get/list/results
--json`` showed of the data; this release must show the same, then take the records on.

SQLite (a copy of ``ops.db``): read back identical, advanced by a newer event, its open
batches polled to the end and archived, ``opstate retry --once`` a no-op that writes nothing,
``opstate track OLD --retry-attempts 2`` attaches a policy (unavailable: no input held), and the
file passes ``integrity_check``. DynamoDB: the dumped items put raw into a table made from this
release's template (with ``retry-index``), read back identical, advanced, listed by
``iter_due`` and not by ``iter_retry_due`` until ``set_retry`` gives an old item a state.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.config import settings
from opstate.domain.costs import REASON_PREVIOUS_RELEASE
from opstate.domain.details import size as details_size
from opstate.quarantine.sqlite import SQLiteQuarantine
from opstate.store.dynamodb import DynamoDBStore
from opstate.store.retry_state import RETRY_ACTIVE, RetryState
from opstate.store.sqlite import SQLiteStore
from opstate.waiters.sqlite import SQLiteWaiterStore
from tests.support.cli import Result, in_process
from tests.support.fake_gemini import FakeGemini
from tests.support.outcomes import batch_output, now_text

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "previous_release"
VIEWS: dict[str, Any] = json.loads((FIXTURE / "views.json").read_text())
KEY = "test-key"
PENDING = "batches/fixture-pending"
RUNNING = "batches/fixture-running"
DONE = "batches/fixture-done"
LOST = "batches/fixture-lost"
NAMES = [DONE, LOST, PENDING, RUNNING]
OPEN = [PENDING, RUNNING]  # LOST is open too, but lost: out of the poll index
RETRY_COLUMNS = ("retry", "retry_status", "retry_rev", "retry_due_ns")
ROOT_DOC: dict[str, Any] = {
    "policy": {"maxAttempts": 2, "resubmitExpired": False, "pendingTimeoutHours": None},
    "model": "models/gemini-2.5-flash",
    "input": {"source": "file:///in.jsonl", "location": None, "sha256": "ab", "rows": 3},
    "unavailable": None,
    "stopped": None,
    "children": [],
    "cancelled": [],
    "final": {"status": "pending", "location": None, "retried": 0, "attempts": 1},
}


def columns(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {row[1] for row in conn.execute("PRAGMA table_info(operations)")}
    finally:
        conn.close()


def retry_columns(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        sql = f"SELECT name, {', '.join(RETRY_COLUMNS)} FROM operations ORDER BY name"
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def finish(fake: FakeGemini, name: str, ok: int) -> None:
    """Gemini's answer for ``name`` from now on: SUCCEEDED, ``ok`` rows and one 429 row."""
    data, _ = batch_output(ok, {429: 1})
    file = fake.put_file(f"out-{name.split('/')[-1]}", body=data, expiration_time=now_text(86400))
    fake.put_batch(name, "SUCCEEDED", update_time=now_text(-1), responses_file=file)
    body = fake.resource(name) or {}
    body["metadata"]["batchStats"] = {"requestCount": str(ok + 1)}
    fake.put(name, body)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "ops.db"
    shutil.copyfile(FIXTURE / "ops.db", path)
    return path


def clear_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (
        "OPSTATE_STORE",
        "OPSTATE_TABLE_NAME",
        "OPSTATE_RESULTS_URL",
        "OPSTATE_RETRY_MAX_ATTEMPTS",
        "OPSTATE_RETRY_RESUBMIT_EXPIRED",
    ):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake_gemini: FakeGemini,
) -> Iterator[Callable[..., Result]]:
    monkeypatch.chdir(tmp_path)
    clear_env(monkeypatch)
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    monkeypatch.setenv("OPSTATE_RESULTS_URL", (tmp_path / "results").as_uri())
    fake_gemini.api_key = KEY
    yield in_process(monkeypatch, capsys)
    settings.cache_clear()


def ok(result: Result) -> Result:
    assert result.code == 0, (result.out, result.err)
    return result


def shows_as_before(cli: Callable[..., Result], store: str) -> None:
    """``get``/``list``/``results --json`` show what the previous release showed."""
    before = VIEWS[store]
    for name in NAMES:
        assert ok(cli("get", name, "--json")).json() == before["get"][name], name
    assert ok(cli("list", "--json")).json() == before["list"]
    results = ok(cli("results", DONE, "--json")).json()
    # Issue 41 adds what the batch cost: the previous release never priced it, so unknown
    # (null, with why), never 0; every other field as the previous release showed it.
    cost = results.pop("cost")
    assert cost["usd"] is None and cost["reason"] == REASON_PREVIOUS_RELEASE
    assert results == before["results"][DONE]
    assert "lineage" not in results and "final" not in results


# --- SQLite -----------------------------------------------------------------------------------


def test_the_sqlite_file_reads_back_as_the_previous_release_showed_it(
    cli: Callable[..., Result], db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the previous release wrote: its columns, no retry slot.
    assert not set(RETRY_COLUMNS) & columns(db)
    assert {"poll_misses", "lost_ns", "archive", "archive_status", "progress"} <= columns(db)
    assert not list(FIXTURE.glob("ops.db-*"))  # closed cleanly: no WAL to replay
    monkeypatch.setenv("OPSTATE_STORE", f"sqlite:///{db}")
    shows_as_before(cli, "sqlite")
    assert set(RETRY_COLUMNS) <= columns(db)  # added on open
    store = SQLiteStore(db)
    try:
        for name in NAMES:
            assert store.get_retry(name) is None
        archive = store.get_archive(DONE)
        assert archive is not None and archive.status == "archived"
        assert archive.summary["rows"] == VIEWS["sqlite"]["results"][DONE]["rows"]
        assert store.get_progress(RUNNING) == VIEWS["sqlite"]["get"][RUNNING]["progress"]
        assert [due.record.name for due in store.iter_marked()] == [LOST]
        assert sorted(due.record.name for due in store.iter_due(None)) == OPEN
        assert list(store.iter_retry_due(time.time_ns())) == []
    finally:
        store.close()
    # The waiter and the quarantined delivery the previous release kept in the same file.
    (waiter,) = SQLiteWaiterStore(db).list(PENDING)
    assert waiter.token == "fixture-task-token" and str(waiter.when) == "terminal"
    (delivery,) = SQLiteQuarantine(db).entries()
    assert delivery.webhook_id == "msg_fixture" and delivery.reason == "invalid_payload"
    assert integrity(db) == "ok"


def test_the_sqlite_file_is_advanced_polled_to_the_end_and_archived(
    cli: Callable[..., Result], db: Path, fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPSTATE_STORE", f"sqlite:///{db}")
    before = VIEWS["sqlite"]["get"]
    # A newer event: the old PENDING record moves on, its version with it.
    ok(cli("report", PENDING, "RUNNING"))
    advanced = ok(cli("get", PENDING, "--json")).json()
    assert advanced["state"] == "RUNNING"
    assert advanced["version"] == before[PENDING]["version"] + 1
    assert advanced["createdAt"] == before[PENDING]["createdAt"]
    # Polled to the end against Gemini, then archived.
    finish(fake_gemini, PENDING, ok=5)
    finish(fake_gemini, RUNNING, ok=39)
    ok(cli("reconcile", "--once"))
    for name in OPEN:
        assert ok(cli("get", name, "--json")).json()["state"] == "SUCCEEDED", name
    assert fake_gemini.hits(LOST) == 0  # lost: never polled again on its own
    archived = ok(cli("archive", "--once")).json()
    assert (archived["archived"], archived["failed"], archived["errors"]) == (2, 0, 0)
    for name, rows in ((PENDING, 6), (RUNNING, 40)):
        view = ok(cli("results", name, "--json")).json()
        assert view["status"] == "archived" and view["rows"]["total"] == rows, name
        assert "lineage" not in view and "final" not in view
    # The old archive is kept as it was.
    kept = ok(cli("results", DONE, "--json")).json()
    assert kept.pop("cost")["reason"] == REASON_PREVIOUS_RELEASE
    assert kept == VIEWS["sqlite"]["results"][DONE]
    # No retry state anywhere: a retry pass does nothing and writes nothing.
    fake_gemini.reset_requests()
    slots = retry_columns(db)
    assert [row[1:] for row in slots] == [(None, None, 0, 0)] * len(NAMES)
    passed = ok(cli("retry", "--once")).json()
    assert not any(passed.values()), passed
    assert fake_gemini.requests == []
    assert retry_columns(db) == slots
    # An old record takes a policy: its retry is unavailable (no input held), nothing created.
    tracked = ok(cli("track", DONE, "--retry-attempts", "2", "--json")).json()
    assert tracked["retry"]["policy"]["maxAttempts"] == 2
    assert tracked["retry"]["status"] == "active" and tracked["retry"]["input"] is None
    assert ok(cli("retry", "--once")).json()["unavailable"] == 1
    store = SQLiteStore(db)
    try:
        state = store.get_retry(DONE)
        assert state is not None and state.status == "done", state
        assert "does not hold this batch's input" in state.doc["unavailable"]
        assert store.get(DONE) is not None
    finally:
        store.close()
    assert not [r for r in fake_gemini.requests if r.method == "POST"]
    assert ok(cli("get", DONE, "--json")).json()["version"] == before[DONE]["version"]
    assert integrity(db) == "ok"


# --- DynamoDB ---------------------------------------------------------------------------------


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """A moto table made from this release's template, holding the dumped items as they are."""
    from moto import mock_aws

    from tests.support.stores import dynamodb_client, unique_table
    from tests.support.template import create_table_from_template

    dump = json.loads((FIXTURE / "dynamodb_items.json").read_text())
    assert "retry-index" not in dump["table"]["indexes"]
    with mock_aws():
        client = dynamodb_client()
        name = unique_table()
        created = create_table_from_template(client, name)
        assert "retry-index" in {g["IndexName"] for g in created["GlobalSecondaryIndexes"]}
        for item in dump["items"]:
            assert not {k for k in item if k.startswith("retry")}, item["name"]
            client.put_item(TableName=name, Item=item)
        monkeypatch.setenv("OPSTATE_STORE", f"dynamodb://{name}")
        yield client, name


def test_dynamodb_items_read_back_advance_and_take_a_retry_state(
    cli: Callable[..., Result], table: tuple[Any, str]
) -> None:
    client, name = table
    shows_as_before(cli, "dynamodb")
    store = DynamoDBStore(name, client=client)
    now = time.time_ns()
    try:
        assert list(store.iter_retry_due(now)) == []
        assert sorted(due.record.name for due in store.iter_due(None)) == OPEN
        assert [due.record.name for due in store.iter_marked()] == [LOST]
        for old in NAMES:
            assert store.get_retry(old) is None
        archive = store.get_archive(DONE)
        assert archive is not None and archive.status == "archived"
        assert store.get_progress(RUNNING) == VIEWS["dynamodb"]["get"][RUNNING]["progress"]
        # Advanced by a newer event.
        ok(cli("report", RUNNING, "SUCCEEDED"))
        record = store.get(RUNNING)
        assert record is not None and str(record.state) == "SUCCEEDED"
        assert record.version == VIEWS["dynamodb"]["get"][RUNNING]["version"] + 1
        # The old item had no details size: the one-call write missed, the read-reduce-write
        # took the event and wrote the size at this version (issue 48).
        raw = client.get_item(TableName=name, Key={"name": {"S": RUNNING}})["Item"]
        assert raw["details_v"] == {"N": str(record.version)}
        assert int(raw["details_bytes"]["N"]) == details_size(record.details)
        assert [due.record.name for due in store.iter_due(None)] == [PENDING]
        # An old item takes a retry state; the record and its archive stay as they were.
        done = store.get(DONE)
        assert done is not None
        state = RetryState(RETRY_ACTIVE, created_ns=done.created_ns, due_ns=now, doc=ROOT_DOC)
        assert store.set_retry(DONE, 0, state)
        assert [r.name for r, _ in store.iter_retry_due(now)] == [DONE]
        stored = store.get_retry(DONE)
        assert stored is not None and stored.rev == 1 and stored.doc == ROOT_DOC
        assert store.get(DONE) == done and store.get_archive(DONE) == archive
    finally:
        store.close()
    # Now a retry root: its results add the lineage and the final result to the old archive's.
    results = ok(cli("results", DONE, "--json")).json()
    assert results["lineage"] == [DONE] and results["final"]["status"] == "pending"
    rest = {k: v for k, v in results.items() if k not in ("lineage", "final", "cost")}
    assert rest == VIEWS["dynamodb"]["results"][DONE]
    assert results["cost"]["usd"] is None
    assert results["cost"]["reason"] == REASON_PREVIOUS_RELEASE
