"""Stored data release 0.6.0 (33242fa) wrote with its own code, opened by this one:
tests/fixtures/previous_release/v060_* (make_060_fixture.py says how it was made). On SQLite
(a copy of ``v060_ops.db``) and on DynamoDB (the dumped items put raw into a moto table made
from this release's template), the results folder moved under the test's and the fake Gemini
holding the batches 0.6.0's left:

- ``opstate get/list/results`` read every record; the finished lineage's cost still shows, the
  figure 0.6.0 stored;
- the child 0.6.0 left ``creating`` (nonce id, no upload recorded; Gemini answered its create
  503) is created exactly once, and a batch carrying its 0.6.0 display name on another input
  is never adopted;
- every lineage reaches its final result;
- 0.6.0's daily spend counter is kept and added to, never reset (a budget at what 0.6.0
  reserved refuses the next plan); the children 0.6.0 created in the last hour, in no hourly
  counter, still count against ``OPSTATE_RETRY_MAX_BATCHES_PER_HOUR`` (they did not: fixed in
  retry/budget.py);
- a reconcile pass with discovery (pages looked up in one read) finds every 0.6.0 record, takes
  none as new and polls the RUNNING one to SUCCEEDED;
- on DynamoDB, the RUNNING batch advances to SUCCEEDED by an event through the one-write path
  (``details_bytes``/``details_v`` written) and a stale event is dropped.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from opstate.config import settings
from opstate.domain.details import size as details_size
from opstate.domain.events_parsing import Source
from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import format_time
from opstate.ingest import ingest
from opstate.retry import lineage, room
from opstate.retry.budget import HOUR_COUNTER
from opstate.retry.spend import DAILY_COUNTER
from opstate.store.dynamodb import DynamoDBStore
from opstate.store.sqlite import SQLiteStore
from tests.support.cli import Result, in_process
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_batches import BATCH_TYPE

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "previous_release"
FIXTURE_DIR = "/tmp/opstate-previous-release-060"  # make_060_fixture.FIXTURE_DIR
GEMINI: dict[str, Any] = json.loads((FIXTURE / "v060_gemini.json").read_text())
FILES: dict[str, dict[str, str]] = json.loads((FIXTURE / "v060_results.json").read_text())
KEY = "fixture-key"  # make_060_fixture.API_KEY
MODEL = "gemini-2.0-flash"
# 0.6.0's spend counter of the UTC day the fixture was made (the same on both stores).
(OLD_SPEND,) = {
    item["name"]["S"].removeprefix("opstate#counter#")
    for item in json.loads((FIXTURE / "v060_dynamodb_items.json").read_text())["items"]
    if item["name"]["S"].startswith("opstate#counter#retry-spend-nano-usd:")
}
STORES = ("sqlite", "dynamodb")


def ok(result: Result) -> Result:
    assert result.code == 0, (result.out, result.err)
    return result


def answered(key: str) -> dict[str, Any]:
    return {
        "key": key,
        "response": {
            "candidates": [
                {"content": {"parts": [{"text": f"answer {key}"}]}, "finishReason": "STOP"}
            ],
            "modelVersion": MODEL,
            "usageMetadata": {
                "promptTokenCount": 1200,
                "candidatesTokenCount": 300,
                "totalTokenCount": 1500,
            },
        },
    }


def moved_text(text: str, moved: Path) -> str:
    """Stored text with the fixture's folder moved to ``moved`` and 0.6.0's spend counter
    moved to today (an upgrade on the day 0.6.0 reserved in)."""
    today = format_time(time.time_ns())[:10]
    return text.replace(FIXTURE_DIR, str(moved)).replace(OLD_SPEND, DAILY_COUNTER.format(day=today))


class Old:
    """The 0.6.0 data opened on one store: the CLI, the fake Gemini, a store to look with."""

    def __init__(
        self, kind: str, cli: Callable[..., Result], fake: FakeGemini, open_store: Any
    ) -> None:
        self.kind = kind
        self.cli = cli
        self.fake = fake
        self.open_store = open_store
        self.names: dict[str, str] = GEMINI[kind]["names"]

    def json(self, *argv: str) -> Any:
        return ok(self.cli(*argv, "--json")).json()

    def retry(self) -> dict[str, Any]:
        passed: dict[str, Any] = ok(self.cli("retry", "--once")).json()
        return passed

    def doc(self, name: str) -> dict[str, Any]:
        store = self.open_store()
        try:
            state = store.get_retry(name)
        finally:
            store.close()
        assert state is not None
        return dict(state.doc)

    def counter(self, name: str) -> int:
        store = self.open_store()
        try:
            return int(store.get_counter(name))
        finally:
            store.close()

    def settle(self, name: str, rows: list[dict[str, Any]]) -> None:
        self.fake.run_batch(name, rows)
        ok(self.cli("refresh", name))
        ok(self.cli("archive", "--once"))


def place_folder(kind: str, moved: Path) -> None:
    for relative, data in FILES[kind].items():
        path = moved / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))


def hold_gemini(fake: FakeGemini, kind: str) -> None:
    fake.api_key = KEY
    for name, body in GEMINI[kind]["batches"].items():
        fake.put(name, body)
    fake._submits.count = 1000  # this fake names its batches from 1: not the fixture's


@pytest.fixture(params=STORES)
def old(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake_gemini: FakeGemini,
) -> Iterator[Old]:
    kind = request.param
    monkeypatch.chdir(tmp_path)
    for key in ("OPSTATE_TABLE_NAME", "OPSTATE_WEBHOOK_SECRETS", "OPSTATE_RETRY_MAX_ATTEMPTS"):
        monkeypatch.delenv(key, raising=False)
    moved = tmp_path / "previous"
    place_folder(kind, moved / kind)
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    monkeypatch.setenv("OPSTATE_RECONCILE_MAX_PAGES", "0")
    monkeypatch.setenv("OPSTATE_RESULTS_URL", (moved / kind / "results").as_uri())
    monkeypatch.setenv("OPSTATE_RETRY_DAILY_BUDGET_USD", "5")  # as 0.6.0 ran
    monkeypatch.setenv("OPSTATE_RETRY_MAX_BATCHES_PER_HOUR", "5")
    hold_gemini(fake_gemini, kind)
    cli = in_process(monkeypatch, capsys)
    if kind == "sqlite":
        db = tmp_path / "ops.db"
        shutil.copyfile(FIXTURE / "v060_ops.db", db)
        conn = sqlite3.connect(db)
        with conn:
            for column in ("retry", "archive"):
                conn.execute(
                    f"UPDATE operations SET {column} = replace({column}, ?, ?)",
                    (FIXTURE_DIR, str(moved)),
                )
            today = DAILY_COUNTER.format(day=format_time(time.time_ns())[:10])
            conn.execute("UPDATE counters SET name = ? WHERE name = ?", (today, OLD_SPEND))
        conn.close()
        monkeypatch.setenv("OPSTATE_STORE", f"sqlite:///{db}")
        yield Old(kind, cli, fake_gemini, lambda: SQLiteStore(str(db)))
        settings.cache_clear()
        return
    from moto import mock_aws

    from tests.support.stores import dynamodb_client, unique_table
    from tests.support.template import create_table_from_template

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    dump = json.loads(moved_text((FIXTURE / "v060_dynamodb_items.json").read_text(), moved))
    with mock_aws():
        client = dynamodb_client()
        table = unique_table()
        create_table_from_template(client, table)
        for item in dump["items"]:
            assert "details_bytes" not in item and "details_v" not in item
            client.put_item(TableName=table, Item=item)
        monkeypatch.setenv("OPSTATE_STORE", f"dynamodb://{table}")
        old = Old(kind, cli, fake_gemini, lambda: DynamoDBStore(table, client=client))
        old.client, old.table = client, table  # type: ignore[attr-defined]
        yield old
    settings.cache_clear()


def test_the_060_records_read_with_the_finished_lineage_s_cost(old: Old) -> None:
    names = old.names
    listed = {entry["name"] for entry in old.json("list")}
    assert set(names.values()) <= listed
    for name in names.values():
        assert old.json("get", name)["name"] == name
    assert old.json("get", names["running"])["state"] == "RUNNING"
    assert old.json("get", names["pending"])["state"] == "PENDING"
    # The finished lineage: its final result and every batch's cost as 0.6.0 priced them.
    stored = old.doc(names["finished"])["final"]
    assert stored["status"] == "final" and stored["cost"]["usd"] == "0.000480"
    view = old.json("results", names["finished"])
    assert view["final"]["status"] == "final"
    assert view["final"]["rows"] == {"total": 4, "answered": 4, "blocked": 0, "failed": 0}
    shown = view["final"]["cost"]
    assert shown["usd"] is not None and float(shown["usd"]) >= 0.00048, shown
    assert float(shown["retries_usd"]) >= 0.00012, shown
    assert float(view["cost"]["usd"]) >= 0.00036, view["cost"]
    child = old.json("results", names["finished_child"])
    assert float(child["cost"]["usd"]) >= 0.00012, child["cost"]
    # A pass over it: nothing to do for a final lineage; its cost stays.
    old.retry()
    assert old.json("results", names["finished"])["final"]["cost"] == shown


FORGED = b'{"key": "a", "request": {"contents": [{"parts": [{"text": "leak-me"}]}]}}\n'


def forge(
    fake: FakeGemini, display_name: str, after_ns: int, data: bytes = FORGED, label: str = "forged"
) -> str:
    """A batch under the child's 0.6.0 display name on input ``data`` (another producer's
    by default), created after the claim."""
    digest = base64.b64encode(hashlib.sha256(data).hexdigest().encode()).decode()
    file = fake.put_file(f"{label}-input", body=data, sha256_hash=digest)
    now = format_time(after_ns)
    name = f"batches/{label}"
    fake.put(
        name,
        {
            "name": name,
            "metadata": {
                "@type": BATCH_TYPE,
                "name": name,
                "model": f"models/{MODEL}",
                "displayName": display_name,
                "inputConfig": {"fileName": file},
                "state": "BATCH_STATE_PENDING",
                "createTime": now,
                "updateTime": now,
            },
        },
    )
    return name


def test_every_060_lineage_reaches_its_final_result(old: Old) -> None:
    names, fake = old.names, old.fake
    creating = names["creating"]
    (entry,) = old.doc(creating)["children"]
    assert entry["phase"] == lineage.CREATING and entry["name"] is None
    assert "file" not in entry and "upload" not in entry  # no upload recorded
    forged = forge(fake, entry["id"], int(entry["claimedNs"]) + 1)
    today = format_time(time.time_ns())[:10]
    spent_before = old.counter(DAILY_COUNTER.format(day=today))
    assert spent_before == 600000  # 0.6.0's reservations: two children at 0.0003 each
    fake.reset_requests()

    passed = old.retry()
    assert passed["errors"] == 0, passed
    (entry,) = old.doc(creating)["children"]
    assert entry["phase"] == lineage.CREATED and entry["name"] not in (forged, None)
    created = [n for n in fake.batches_created() if n.startswith("batches/created-1")]
    assert created == [entry["name"]]  # created exactly once, the forged batch not adopted
    # Found by its display name, refused on its input's own sha256.
    assert any(r.method == "GET" and r.name == "files/forged-input" for r in fake.requests)
    assert [json.loads(x)["key"] for x in fake.batch_input(entry["name"]).splitlines()] == [
        "a",
        "b",
    ]
    # 0.6.0's spend is kept: the new reservation is added to it, never a reset.
    assert old.counter(DAILY_COUNTER.format(day=today)) >= spent_before
    hour = HOUR_COUNTER.format(hour=format_time(time.time_ns())[:13])
    assert old.counter(hour) in (1, 2)  # this pass's create (2: the hour turned meanwhile)

    # A second pass creates nothing more for it.
    old.retry()
    assert [n for n in fake.batches_created() if n.startswith("batches/created-1")] == created

    # Each child ends; each lineage reaches its final result.
    old.settle(entry["name"], [answered("a"), answered("b")])
    old.settle(names["midretry_child"], [answered("m0"), answered("m1")])
    old.retry()
    # Every batch's cost summed, 0.6.0's archives with this release's: 1, 2 and 4 answered rows
    # of 1200 + 300 tokens at $0.00012 each (the finished lineage's, as 0.6.0 wrote it).
    lineages = (
        (creating, 3, 0.00036),
        (names["midretry"], 4, 0.00048),
        (names["finished"], 4, 0.00048),
    )
    for root, rows, usd in lineages:
        final = old.json("results", root)["final"]
        assert final["status"] == "final", (root, final)
        assert final["rows"] == {"total": rows, "answered": rows, "blocked": 0, "failed": 0}
        cost = final["cost"]
        assert cost["usd"] == usd and cost["model"] == MODEL, (root, cost)
    # The old child's real cost charged nothing beyond 0.6.0's reservation (no reservedIn).
    assert old.counter(DAILY_COUNTER.format(day=today)) >= spent_before
    # The project's queue (issue 46): the child 0.6.0 created recorded no room and none is
    # freed for it; what this release reserved (the child it created) was given back once.
    (mid,) = old.doc(names["midretry"])["children"]
    assert mid["phase"] == lineage.CREATED and "reserved" not in mid
    model = MODEL.removeprefix("models/")
    taken = old.counter(room.RESERVED.format(model=model)), old.counter(room.SLOTS_RESERVED)
    given = old.counter(room.FREED.format(model=model)), old.counter(room.SLOTS_FREED)
    assert taken == given
    assert fake.resource(forged) is not None and not any(
        r.name == forged and r.method == "POST" for r in fake.requests
    )


def test_the_060_claim_s_own_batch_is_adopted_on_its_input_s_sha256(old: Old) -> None:
    """Had 0.6.0's create reached Gemini before the 503, its batch (0.6.0's display name, the
    planned input's very bytes) is adopted, not created again."""
    creating, fake = old.names["creating"], old.fake
    (entry,) = old.doc(creating)["children"]
    kept = Path(str(entry["input"]).removeprefix("file://")).read_bytes()
    assert hashlib.sha256(kept).hexdigest() == entry["sha256"]
    genuine = forge(fake, entry["id"], int(entry["claimedNs"]) + 1, kept, "genuine")
    passed = old.retry()
    assert passed["errors"] == 0, passed
    (entry,) = old.doc(creating)["children"]
    assert (entry["phase"], entry["name"]) == (lineage.CREATED, genuine)
    assert not [n for n in fake.batches_created() if n.startswith("batches/created-1")]


def test_a_new_lineage_sees_the_060_spend_of_the_day(
    old: Old, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget just at what 0.6.0 reserved today: the next plan is refused, not granted as if
    the day had started afresh."""
    monkeypatch.setenv("OPSTATE_RETRY_DAILY_BUDGET_USD", "0.0006")
    creating = old.names["creating"]
    passed = old.retry()
    assert passed["errors"] == 0, passed
    # The 0.6.0 claim was reserved by 0.6.0: it is created; the pass needs no new reservation.
    (entry,) = old.doc(creating)["children"]
    assert entry["phase"] == lineage.CREATED
    # The midretry child fails a row again: its next attempt would need more than is left.
    old.settle(old.names["midretry_child"], [answered("m0"), {"key": "m1", "error": {
        "code": 503, "message": "fake UNAVAILABLE", "status": "UNAVAILABLE"}}])  # fmt: skip
    old.retry()
    doc = old.doc(old.names["midretry"])
    assert "OPSTATE_RETRY_DAILY_BUDGET_USD" in str(doc.get("stopped")), doc.get("stopped")


@pytest.mark.parametrize("old", ["dynamodb"], indirect=True)  # the one-write path's store
def test_the_running_060_item_advances_by_an_event_in_one_write(old: Old) -> None:
    client, table = old.client, old.table  # type: ignore[attr-defined]
    running = old.names["running"]
    store = old.open_store()
    try:
        before = store.get(running)
        assert before is not None and before.state == State.RUNNING
        late = before.update_time_ns + 1_000_000_000
        decision = ingest(store, OpEvent(running, State.SUCCEEDED, late, Source.WEBHOOK))
        assert decision.applied
        after = store.get(running)
        assert after is not None and after.state == State.SUCCEEDED
        assert after.version == before.version + 1
        raw = client.get_item(TableName=table, Key={"name": {"S": running}})["Item"]
        assert raw["details_v"] == {"N": str(after.version)}
        assert int(raw["details_bytes"]["N"]) == details_size(after.details)
        stale = ingest(
            store, OpEvent(running, State.RUNNING, before.update_time_ns - 1, Source.WEBHOOK)
        )
        assert not stale.applied
        assert store.get(running) == after
        due = {d.record.name for d in store.iter_due(None)}
        assert old.names["pending"] in due and running not in due
    finally:
        store.close()
    assert old.json("get", running)["state"] == "SUCCEEDED"


@pytest.mark.parametrize("bound", [2, 3])
def test_the_batches_0_6_0_created_this_hour_still_count_for_the_hourly_bound(
    old: Old, monkeypatch: pytest.MonkeyPatch, bound: int
) -> None:
    """0.6.0 kept no hourly counter: it counted the children its retry states say were
    created or claimed in the last hour. Upgraded within that hour, those still count: the
    hour's bound is not reset by the upgrade."""
    now = time.time_ns()
    store = old.open_store()
    try:
        for root in (old.names["midretry"], old.names["creating"]):
            state = store.get_retry(root)
            assert state is not None
            doc = lineage.mutable(state.doc)
            for entry in lineage.children(doc):
                for at in ("claimedNs", "createdNs"):
                    if at in entry:  # as if 0.6.0 had just made them
                        entry[at] = now - 60 * 1_000_000_000
            assert store.set_retry(root, state.rev, replace(state, doc=doc))
    finally:
        store.close()
    creating = old.names["creating"]
    # 0.6.0 created the midretry child and claimed the creating one this hour: 2 of a bound
    # of 2 leave no room (as 0.6.0 itself would have counted); a bound of 3 leaves one.
    monkeypatch.setenv("OPSTATE_RETRY_MAX_BATCHES_PER_HOUR", str(bound))
    old.retry()
    (entry,) = old.doc(creating)["children"]
    created = [n for n in old.fake.batches_created() if n.startswith("batches/created-1")]
    if bound == 2:
        assert (entry["phase"], created) == (lineage.CREATING, [])
    else:
        assert (entry["phase"], created) == (lineage.CREATED, [entry["name"]])


def test_a_reconcile_pass_with_discovery_reads_the_060_records(
    old: Old, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Discovery reads Gemini's listing pages and looks each page's names up in the store in
    one read (BatchGetItem on DynamoDB): 0.6.0's records are found, none taken as new, and the
    open ones polled on."""
    names, fake = old.names, old.fake
    body = fake.resource(names["running"]) or {}
    body["metadata"].update(state="BATCH_STATE_SUCCEEDED", updateTime=format_time(time.time_ns()))
    fake.put(names["running"], body)
    monkeypatch.setenv("OPSTATE_RECONCILE_MAX_PAGES", "3")
    before = {e["name"]: e for e in old.json("list")}
    passed = ok(old.cli("reconcile", "--once")).json()
    assert (passed["errors"], passed["applied"], passed["not_found"]) == (0, 1, 0), passed
    after = {e["name"]: e for e in old.json("list")}
    assert set(after) == set(before)
    assert after[names["running"]]["state"] == "SUCCEEDED"
    assert after[names["pending"]]["state"] == "PENDING"
    for name in set(before) - {names["running"]}:
        assert after[name]["version"] == before[name]["version"], name
