"""The retry engine against races, store faults, hostile outputs and old data (issue 33): two
runners on one root make one child per plan; a store fault mid-pass ends that root's step and
the next pass finishes it; hostile output lines never crash a pass nor retry a key the input
lacks, and final.jsonl keeps one line per original key; records of the previous release and
retry states of an earlier incarnation are never acted on.

The rig (SQLite store file, results folder, real google-genai client on the fake Gemini, the
clock the test gives) is ``test_retry_engine``'s.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.config import settings
from opstate.gemini.client import make_client
from opstate.outcomes.file_sink import FileSink
from opstate.retry import children as children_module
from opstate.retry import lineage
from opstate.retry import passes as passes_module
from opstate.retry.engine import retry_once
from opstate.retry.passes import RetryConfig, RetryResult
from opstate.retry.rules import DEFAULT_TABLE
from opstate.store.port import StoreUnavailableError
from opstate.store.retry_state import RETRY_DONE, RetryState
from opstate.store.sqlite import SQLiteStore
from tests.integration.test_retry_engine import Rig, S, make_rig
from tests.integration.test_retry_scenario import ok, settle
from tests.integration.test_store_polls import LEGACY_SCHEMA
from tests.integration.test_store_retry import PREVIOUS_COLUMNS, T0
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import answered, failed, write_input

LEASE_NS = 900 * S


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


class Wrapped:
    """A store that forwards everything, ``set_retry`` and ``get_archive`` through hooks."""

    def __init__(
        self,
        inner: SQLiteStore,
        on_set: Callable[[int, str, RetryState, Callable[[], bool]], bool] | None = None,
        on_archive: Callable[[int], None] | None = None,
    ) -> None:
        self.inner = inner
        self.on_set = on_set
        self.on_archive = on_archive
        self.sets = 0
        self.archives = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def set_retry(self, name: str, expected_rev: int, state: RetryState) -> bool:
        self.sets += 1

        def write() -> bool:
            return self.inner.set_retry(name, expected_rev, state)

        return write() if self.on_set is None else self.on_set(self.sets, name, state, write)

    def get_archive(self, name: str) -> Any:
        self.archives += 1
        if self.on_archive is not None:
            self.on_archive(self.archives)
        return self.inner.get_archive(name)


def failing_root(rig: Rig, keys: list[str], attempts: str = "2") -> str:
    """A settled root whose first two keys failed 503 and the rest were answered."""
    root = rig.submit(keys, "--retry-attempts", attempts)
    rig.finish(
        root, [failed(k, 503, "UNAVAILABLE") for k in keys[:2]] + [answered(k) for k in keys[2:]]
    )
    return root


def finish_lineage(rig: Rig, root: str, keys: list[str], at_ns: int) -> None:
    """The one child answers; the next pass writes final: every key answered, one child."""
    created = rig.fake.batches_created()
    assert len(created) == 2, created
    (entry,) = rig.state(root).doc["children"]
    assert (entry["phase"], entry["name"]) == (lineage.CREATED, created[1])
    assert rig.child_keys(created[1]) == keys[:2]
    rig.finish(created[1], [answered(k) for k in keys[:2]])
    assert rig.run(at_ns).final == 1
    final, by_key = rig.final(root)
    assert final["rows"] == {"total": len(keys), "answered": len(keys), "blocked": 0, "failed": 0}
    assert set(by_key) == set(keys) and by_key[keys[0]]["attempt"] == 1
    assert rig.fake.batches_created() == created


# -- 4. two runners ---------------------------------------------------------------------------


def test_two_threads_racing_one_root_make_one_child(rig: Rig) -> None:
    keys = ["a", "b", "c"]
    root = failing_root(rig, keys)
    barrier = threading.Barrier(2, timeout=30)

    def meet(number: int, name: str, state: RetryState, write: Callable[[], bool]) -> bool:
        if number == 1:
            barrier.wait()  # both read the same revision, both write it now
        return write()

    results: list[RetryResult] = []
    current = settings()

    def runner() -> None:
        store = SQLiteStore(str(rig.db))
        client = make_client(current, timeout_s=30)
        try:
            results.append(
                retry_once(
                    Wrapped(store, on_set=meet),
                    FileSink(rig.tmp_path / "results"),
                    client,
                    RetryConfig(DEFAULT_TABLE),
                    every=True,
                )
            )
        finally:
            client.close()
            store.close()

    threads = [threading.Thread(target=runner) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    settings.cache_clear()
    assert len(results) == 2
    assert sorted(r.skipped for r in results) == [0, 1]
    assert sum(r.submitted for r in results) == 1 and sum(r.errors for r in results) == 0
    finish_lineage(rig, root, keys, time.time_ns())


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_runner_paused_at_its_claim_while_another_runs_leaves_one_child(
    rig: Rig, when: str
) -> None:
    """``before``: the other runner claims and creates first, the paused one loses its claim.
    ``after``: the paused one holds the claim, the other leaves it alone; the paused one then
    creates the child and names it in the plan at once (no lease to wait out)."""
    keys = ["a", "b", "c"]
    root = failing_root(rig, keys)
    now = time.time_ns()
    other: list[RetryResult] = []

    def pause(number: int, name: str, state: RetryState, write: Callable[[], bool]) -> bool:
        entries = lineage.children(state.doc)
        claim = name == root and any(e["phase"] == lineage.CREATING for e in entries)
        if claim and not other and when == "before":
            other.append(rig.run(now))
        written = write()
        if claim and not other and when == "after":
            other.append(rig.run(now))
        return written

    paused = rig.run(now, wrap=lambda store: Wrapped(store, on_set=pause))
    (second,) = other
    if when == "before":
        assert (paused.skipped, paused.submitted, second.submitted) == (1, 0, 1)
    else:
        assert (paused.skipped, paused.submitted, second.submitted) == (0, 1, 0)
    assert paused.errors == second.errors == 0
    finish_lineage(rig, root, keys, now)


def test_a_quota_stop_while_another_runner_wrote_is_recorded_and_counted_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[str] = []
    monkeypatch.setattr(children_module, "count", lambda name, *a, **k: counted.append(name))
    monkeypatch.setattr(passes_module, "count", lambda name, *a, **k: counted.append(name))
    keys = ["a", "b", "c"]
    root = failing_root(rig, keys)
    rig.fake.fail_create(429, "Your prepayment credits are depleted.", times=None)
    now = time.time_ns()
    other: list[RetryResult] = []

    def pause(number: int, name: str, state: RetryState, write: Callable[[], bool]) -> bool:
        written = write()
        claim = any(e["phase"] == lineage.CREATING for e in lineage.children(state.doc))
        if name == root and claim and not other:
            other.append(rig.run(now))  # finds the claim held: writes when to look again
        return written

    paused = rig.run(now, wrap=lambda store: Wrapped(store, on_set=pause))
    assert (paused.stopped, paused.skipped, paused.errors, paused.final) == (1, 0, 0, 1)
    assert other[0].stopped == 0
    for later in (now + LEASE_NS + S, now + 2 * LEASE_NS):
        assert rig.run(later).as_dict() == RetryResult().as_dict()
    assert counted == ["RetryStopped"]
    assert rig.fake.batches_created() == [root]
    assert "prepayment credits are depleted" in rig.state(root).doc["stopped"]


# -- 5. store faults ----------------------------------------------------------------------------

# The writes of the pass that plans and creates the child: the root's room in the queue freed
# (issue 46: its batch ended), the root re-dated (before any heavy work), the input covered,
# the plan, the claim, the upload recorded before the create (issue 47), the child's lineage
# beside its record, the child named in the plan.
SET_STEPS = 8


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("step", range(1, SET_STEPS + 1))
def test_a_store_fault_on_a_retry_write_is_finished_by_the_next_pass(
    rig: Rig, step: int, when: str
) -> None:
    """The Nth write fails (``before``: not written; ``after``: written, its answer lost)."""
    keys = ["a", "b", "c", "d"]
    root = failing_root(rig, keys)
    now = time.time_ns()

    def fault(number: int, name: str, state: RetryState, write: Callable[[], bool]) -> bool:
        if number == step and when == "after":
            write()
        if number == step:
            raise StoreUnavailableError("the store is away")
        return write()

    broken = rig.run(now, wrap=lambda store: Wrapped(store, on_set=fault))
    assert (broken.errors, broken.skipped, broken.final) == (1, 0, 0)
    # A pass once any claim the broken one left has run out finishes the step.
    later = now + LEASE_NS + S
    again = rig.run(later)
    assert again.errors == 0 and again.submitted == (
        0 if step == SET_STEPS and when == "after" else 1
    )
    assert rig.run(later).submitted == 0
    finish_lineage(rig, root, keys, later)
    child = rig.fake.batches_created()[1]
    assert rig.state(child).doc["lineage"] == {
        "root": root,
        "parent": root,
        "attempt": 1,
        "id": rig.state(root).doc["children"][0]["id"],
    }


@pytest.mark.parametrize("step", [1, 2])
def test_a_store_fault_reading_archives_is_finished_by_the_next_pass(rig: Rig, step: int) -> None:
    keys = ["a", "b", "c"]
    root = failing_root(rig, keys)
    assert rig.run().submitted == 1
    child = rig.fake.batches_created()[1]
    rig.finish(child, [answered(k) for k in keys[:2]])
    state = rig.state(root)

    def fault(number: int) -> None:
        if number == step:
            raise StoreUnavailableError("the store is away")

    broken = rig.run(wrap=lambda store: Wrapped(store, on_archive=fault))
    assert (broken.errors, broken.final) == (1, 0)
    assert rig.state(root) == state  # nothing written
    finish_lineage(rig, root, keys, time.time_ns())


class ListingFails(Wrapped):
    """A store whose listing of due roots fails after ``after`` entries (the pass's listing:
    the budget's own listing of the active roots, before a create, is answered)."""

    def __init__(self, inner: SQLiteStore, after: int) -> None:
        super().__init__(inner)
        self.after = after
        self.listed = 0

    def iter_retry_due(self, now_ns: int) -> Iterator[Any]:
        self.listed += 1
        if self.listed > 1:
            yield from self.inner.iter_retry_due(now_ns)
            return
        for number, entry in enumerate(self.inner.iter_retry_due(now_ns)):
            if number == self.after:
                break
            yield entry
        raise StoreUnavailableError("the store is away")


@pytest.mark.parametrize("after", [0, 1])
def test_a_store_fault_listing_due_roots_is_counted_and_the_next_pass_lists_again(
    rig: Rig, after: int
) -> None:
    keys = ["a", "b"]
    root = failing_root(rig, keys)
    broken = rig.run(wrap=lambda store: ListingFails(store, after))
    assert broken.errors == 1 and broken.submitted == after  # the pass ends, never raises
    again = rig.run()
    assert again.errors == 0 and broken.submitted + again.submitted == 1
    assert len(rig.fake.batches_created()) == 2 and root in rig.fake.batches_created()


# -- 6. hostile outputs -------------------------------------------------------------------------


def line(value: Any) -> bytes:
    return json.dumps(value).encode() + b"\n"


def finish_raw(rig: Rig, name: str, data: bytes) -> None:
    """Batch ``name`` ends with ``data`` as its output file, whatever its lines are."""
    rig.fake.run_batch(name, [answered("placeholder")])
    rig.fake.put_file(f"{name.removeprefix('batches/')}-output", body=data)
    settle(rig.cli, name)


def test_hostile_output_lines_never_crash_a_pass_nor_retry_a_foreign_key(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPSTATE_RESULTS_MAX_LINE_MIB", "1")
    keys = [f"k{i}" for i in range(8)]
    root = rig.submit(keys, "--retry-attempts", "2")
    unavailable = {"code": 503, "message": "x", "status": "UNAVAILABLE"}
    answer = answered("x")["response"]
    output = b"".join(
        [
            b"not json {\n",
            line({"response": answer}),  # no key
            line([1, 2, 3]),
            line("text"),
            line(None),
            line({"key": 5, "error": unavailable}),  # a key that is not text
            line({"key": "k0", "error": {"code": "503", "message": "as text"}}),
            line({"key": "k1", "error": {"code": True, "message": "a bool"}}),
            line({"key": "k2", "error": {"code": 10**30, "status": "UNAVAILABLE"}}),
            line({"key": "k3", "response": "not an object"}),
            line({"key": "k4", "error": unavailable}),
            line({"key": "k4", "response": answer}),  # the later line wins: answered
            line({"key": "k5", "response": answer}),
            line({"key": "k5", "error": unavailable}),  # the later line wins: retried
            line({"key": "k6", "response": {"text": "x" * (1024 * 1024 + 10)}}),  # too long
            line(answered("k7")),
        ]
    )
    finish_raw(rig, root, output)
    first = rig.run()
    assert (first.errors, first.unavailable, first.submitted) == (0, 0, 1)
    child = rig.fake.batches_created()[1]
    assert rig.child_keys(child) == ["k0", "k5"]
    child_output = b"".join(
        [
            line({"key": "stranger", "error": unavailable}),  # a key the input never held
            b"\x00\xff garbage\n",
            line({"key": "k0", "error": unavailable}),
            line(answered("k5")),
        ]
    )
    finish_raw(rig, child, child_output)
    second = rig.run()
    assert (second.errors, second.submitted) == (0, 1)
    grandchild = rig.fake.batches_created()[2]
    assert rig.child_keys(grandchild) == ["k0"]  # never "stranger"
    rig.finish(grandchild, [answered("k0"), {"key": "k0", "response": []}])
    third = rig.run()
    assert (third.errors, third.final) == (0, 1)
    final, by_key = rig.final(root)
    assert list(by_key) != [] and set(by_key) == set(keys)
    assert final["rows"] == {"total": 8, "answered": 4, "blocked": 0, "failed": 4}
    huge = str(10**30)
    assert final["errors"] == {"unknown": 2, huge: 1, "missing": 1}
    assert (by_key["k0"]["attempt"], "response" in by_key["k0"]) == (2, True)
    assert (by_key["k5"]["attempt"], "response" in by_key["k5"]) == (1, True)
    assert by_key["k6"]["error"]["code"] == "missing"
    assert len(rig.fake.batches_created()) == 3


def test_an_input_that_does_not_cover_the_output_is_unavailable(rig: Rig) -> None:
    source = write_input(rig.tmp_path / "short.jsonl", ["k0", "k1", "k2"])
    rig.fake.put_batch("batches/elsewhere", "BATCH_STATE_RUNNING", model="models/gemini-2.5-flash")
    ok(rig.cli("track", "batches/elsewhere", "--retry-attempts", "2", "--input", source.as_uri()))
    rig.finish("batches/elsewhere", [failed(f"k{i}", 503, "UNAVAILABLE") for i in range(6)])
    result = rig.run()
    assert (result.unavailable, result.planned, result.errors) == (1, 0, 0)
    state = rig.state("batches/elsewhere")
    assert state.status == RETRY_DONE
    assert state.doc["unavailable"] == "the input lacks 3 of the output's keys"
    assert rig.fake.batches_created() == []
    assert rig.run().as_dict() == RetryResult().as_dict()


def test_an_input_with_a_bad_line_is_unavailable_naming_the_line(rig: Rig) -> None:
    source = write_input(rig.tmp_path / "bad.jsonl", ["k0", "k1"])
    rig.fake.put_batch("batches/elsewhere", "BATCH_STATE_RUNNING", model="models/gemini-2.5-flash")
    ok(rig.cli("track", "batches/elsewhere", "--retry-attempts", "2", "--input", source.as_uri()))
    with source.open("ab") as out:
        out.write(b'{"key": "k2"}\n')  # no request: the input is bad by the time it is read
    result = rig.run()
    assert (result.unavailable, result.errors) == (1, 0)
    state = rig.state("batches/elsewhere")
    # The operator reads the line in the store and the log; every reader of the record sees
    # only "input unusable" (issue 38: nothing about the object's format or keys).
    assert state.status == RETRY_DONE and state.doc["unavailable"] == "input unusable"
    assert "line 3" in state.doc["unavailableDetail"]
    assert "request" in state.doc["unavailableDetail"]
    assert not (rig.tmp_path / "results" / "inputs").exists()


# -- 7. and 8. data the engine must leave alone ----------------------------------------------


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_records_of_the_previous_release_are_left_alone(
    tmp_path: Path, fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_SCHEMA + PREVIOUS_COLUMNS)
    row = ("SUCCEEDED", 3, f"{T0:021d}", 3, "batch", "poll", "{}", T0 - S, T0)
    insert = (
        "INSERT INTO operations (name, state, rank, update_ns, version, kind, source, details, "
        "created_ns, applied_ns, open_ns, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    conn.execute(insert, ("batches/old", *row, None, T0 // S + 90 * 86400))
    conn.execute(insert, ("batches/old-open", "PENDING", 0, *row[2:], f"{T0:021d}", None))
    conn.commit()
    before = conn.execute("SELECT * FROM operations ORDER BY name").fetchall()
    conn.close()
    results = tmp_path / "results"
    store = SQLiteStore(path)
    client = make_client(settings(), timeout_s=30)
    try:
        for names in (None, ["batches/old", "batches/old-open"]):
            result = retry_once(
                store,
                FileSink(results),
                client,
                RetryConfig(DEFAULT_TABLE),
                clock_ns=lambda: T0 + 1000 * 3600 * S,
                names=names,
                every=names is None,
            )
            assert result.as_dict() == RetryResult().as_dict()
        assert (
            store.get_retry("batches/old") is None and store.get_retry("batches/old-open") is None
        )
    finally:
        client.close()
        store.close()
        settings.cache_clear()
    conn = sqlite3.connect(path)
    after = conn.execute("SELECT * FROM operations ORDER BY name").fetchall()
    retry_columns = conn.execute(
        "SELECT retry, retry_status, retry_rev, retry_due_ns FROM operations"
    ).fetchall()
    conn.close()
    assert [r[: len(before[0])] for r in after] == before
    assert retry_columns == [(None, None, 0, 0)] * 2
    assert fake_gemini.requests == [] and files_under(results) == []


def test_a_retry_state_of_an_earlier_incarnation_is_never_acted_on(rig: Rig) -> None:
    keys = ["a", "b", "c"]
    root = rig.submit(keys, "--retry-attempts", "2", "--pending-timeout-hours", "1")
    rig.fake.run_batch(root, [failed(k, 503, "UNAVAILABLE") for k in keys])
    state = rig.state(root)
    # The record is a new incarnation (created again) yet the slot of the old one remains.
    conn = sqlite3.connect(rig.db)
    conn.execute("UPDATE operations SET created_ns = created_ns + 1 WHERE name = ?", (root,))
    conn.commit()
    conn.close()
    rig.fake.reset_requests()
    results = rig.tmp_path / "results"
    kept = files_under(results)
    for names in (None, [root]):  # due, pending past its timeout: still not read nor cancelled
        result = rig.run(time.time_ns() + 2 * 3600 * S, names=names)
        assert result.as_dict() == RetryResult().as_dict()
    assert rig.fake.requests == [] and files_under(results) == kept
    settle(rig.cli, root)  # settled with transient failures: still nothing planned
    rig.fake.reset_requests()
    kept = files_under(results)
    for names in (None, [root]):
        assert rig.run(names=names).as_dict() == RetryResult().as_dict()
    assert rig.state(root) == state
    assert rig.fake.requests == [] and files_under(results) == kept
