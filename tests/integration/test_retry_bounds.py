"""The retry pass's bounds (issue 39): the display-name search before a re-claimed create stops
on an endless listing (a repeated next-page token, the page cap, the pass's time) and fails
closed: nothing is created, an error is counted, the entry is due again.

Every pass runs ``retry_once`` in-process on the embedded SQLite store, the results folder and
the real google-genai client talking to the fake Gemini (``test_retry_engine``'s rig).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.config import settings
from opstate.gemini.client import make_client
from opstate.gemini.submit import MAX_SEARCH_PAGES
from opstate.outcomes.wiring import results_url_for, sink_from_url
from opstate.retry import children as children_module
from opstate.retry import engine as engine_module
from opstate.retry import lineage
from opstate.retry import passes as passes_module
from opstate.retry.engine import retry_once
from opstate.retry.passes import RetryResult
from opstate.retry.wiring import config_from
from opstate.store.sqlite import SQLiteStore
from tests.integration.test_retry_engine import Rig, creates, listings, make_rig
from tests.integration.test_retry_guards import kept_path, swap
from tests.integration.test_retry_scenario import settle
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import answered, failed, write_input

S = 1_000_000_000
MODEL = "gemini-2.5-flash"


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


def a_claimed_child(rig: Rig) -> tuple[str, list[str], int]:
    """A root whose planned child was claimed once and refused with a 503 (so the next claim
    searches the listing before it creates); the root, its keys and the retry time."""
    keys = [f"k{i}" for i in range(4)]
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys[:3]] + [answered(keys[3])])
    rig.fake.fail_create(503, "The service is currently unavailable.", times=1)
    now = time.time_ns()
    first = rig.run(now)
    assert (first.planned, first.submitted, first.errors) == (1, 0, 1)
    check_s = config_from(settings()).check_s
    settings.cache_clear()
    return root, keys, now + int(check_s * S) + 1


def run_with_time(rig: Rig, at_ns: int, remaining: Iterator[float]) -> RetryResult:
    """One pass at ``at_ns`` whose remaining time (seconds) is the next value of ``remaining``
    at each look."""
    current = settings()
    store = SQLiteStore(str(rig.db))
    client = make_client(current, timeout_s=30)
    try:
        return retry_once(
            store,
            sink_from_url(results_url_for(current), current),
            client,
            config_from(current),
            clock_ns=lambda: at_ns,
            remaining_s=lambda: next(remaining),
            safety_s=1.0,
            every=True,
        )
    finally:
        client.close()
        store.close()
        settings.cache_clear()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["repeat", "fresh"])
def test_an_endless_listing_ends_the_search_and_nothing_is_created(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    counted: list[str] = []
    monkeypatch.setattr(children_module, "count", lambda name, *a, **k: counted.append(name))
    monkeypatch.setattr(passes_module, "count", lambda name, *a, **k: counted.append(name))
    root, keys, later = a_claimed_child(rig)
    (before,) = rig.state(root).doc["children"]
    rig.fake.endless_listing(mode)
    rig.fake.reset_requests()
    result = rig.run(later)
    assert (result.submitted, result.errors, result.stopped) == (0, 1, 0)
    assert counted == ["RetrySearchCut"]
    requests = rig.requests()
    assert creates(requests) == []
    assert len(listings(requests)) == (2 if mode == "repeat" else MAX_SEARCH_PAGES)
    (entry,) = rig.state(root).doc["children"]
    assert entry["phase"] == lineage.CREATING and entry["name"] is None
    assert "stopped before the listing's end" in entry["error"]
    # due again: not before its retry time, and created once the listing ends
    assert entry["claimUntilNs"] > later and entry["claims"] == before["claims"] + 1
    assert rig.state(root).due_ns == entry["claimUntilNs"]
    rig.fake.endless_listing(None)
    again = rig.run(entry["claimUntilNs"] + 1)
    assert again.submitted == 1
    (child,) = rig.fake.batches_created()[1:]
    assert rig.child_keys(child) == keys[:3]


@pytest.mark.timeout(60)
def test_the_search_stops_when_the_pass_runs_out_of_time(rig: Rig) -> None:
    root, _keys, later = a_claimed_child(rig)
    rig.fake.endless_listing("fresh")
    rig.fake.reset_requests()
    # 10 s left when the root is taken, then 0.5 s (below the 1 s safety margin) for ever
    remaining = iter([10.0, 10.0, 10.0, *([0.5] * 1000)])
    result = run_with_time(rig, later, remaining)
    assert (result.submitted, result.errors) == (0, 1)
    requests = rig.requests()
    assert creates(requests) == [] and 1 <= len(listings(requests)) < 5
    (entry,) = rig.state(root).doc["children"]
    assert "ran out of time" in entry["error"]


@pytest.mark.timeout(60)
def test_a_submit_run_again_on_an_endless_listing_creates_nothing(rig: Rig) -> None:
    source = write_input(rig.tmp_path / "in.jsonl", ["a", "b"])
    args = ("submit", str(source), "--model", MODEL, "--json")
    rig.fake.fail_create(503, "The service is currently unavailable.", times=1)
    first = rig.cli(*args)
    assert first.code != 0 and rig.fake.batches_created() == []
    rig.fake.endless_listing("fresh")
    rig.fake.reset_requests()
    again = rig.cli(*args)
    assert again.code != 0
    assert "stopped before the listing's end" in again.err
    assert rig.fake.batches_created() == [] and creates(rig.requests()) == []
    assert len(listings(rig.requests())) == MAX_SEARCH_PAGES
    rig.fake.endless_listing(None)
    assert rig.cli(*args).code == 0 and len(rig.fake.batches_created()) == 1


class Crash(BaseException):
    """A pass dying on a root (out of memory, killed): nothing in the pass catches it."""


def test_a_root_is_re_dated_before_heavy_work_so_a_pass_dying_on_it_does_not_block_the_next(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    roots = []
    for index in range(2):
        keys = [f"r{index}-k{i}" for i in range(3)]
        root = rig.submit(keys, "--retry-attempts", "1")
        rig.finish(root, [failed(keys[0], 503, "UNAVAILABLE"), answered(keys[1])])
        roots.append(root)
    first, second = roots
    real_cover = engine_module.RetryRunner._check_cover

    def dies_on_first(self: Any, root: Any, *args: Any) -> Any:
        if root.name == first:
            raise Crash(root.name)
        return real_cover(self, root, *args)

    taken: list[str] = []
    real_one = engine_module.RetryRunner.one

    def one(self: Any, root: Any, state: Any) -> None:
        taken.append(root.name)
        real_one(self, root, state)

    monkeypatch.setattr(engine_module.RetryRunner, "_check_cover", dies_on_first)
    monkeypatch.setattr(engine_module.RetryRunner, "one", one)
    now = time.time_ns()
    with pytest.raises(Crash):
        rig.run(now)
    assert taken == [first]
    taken.clear()
    with pytest.raises(Crash):
        rig.run(now + 1)
    assert taken[0] == second  # the root behind the one that died is taken first
    monkeypatch.setattr(engine_module.RetryRunner, "_check_cover", real_cover)
    taken.clear()
    result = rig.run(now + 2)
    assert result.planned == 1 and taken[0] == first


def test_a_whole_resubmit_is_split_by_max_rows(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSTATE_RETRY_MAX_ROWS", "3")
    keys = [f"k{i}" for i in range(7)]
    root = rig.submit(keys, "--resubmit-expired")
    rig.fake.set_batch_state(root, "BATCH_STATE_EXPIRED")
    settle(rig.cli, root)
    result = rig.run()
    assert (result.planned, result.submitted) == (3, 3)
    created = rig.fake.batches_created()[1:]
    assert [rig.child_keys(n) for n in created] == [keys[0:3], keys[3:6], keys[6:7]]
    children = rig.state(root).doc["children"]
    assert [(c["rows"], c["whole"], c["parent"]) for c in children] == [
        (3, True, root),
        (3, True, root),
        (1, True, root),
    ]
    source = (rig.tmp_path / "in-1.jsonl").read_bytes().splitlines(keepends=True)
    assert b"".join(rig.fake.batch_input(n) for n in created) == b"".join(source)
    # each file a child of its own (issue 38): a nonce id, its own sha256, Gemini's model
    assert len({c["nonce"] for c in children}) == 3
    for index, (child, name) in enumerate(zip(children, created, strict=True)):
        assert child["id"] == f"opstate-{child['nonce']}-a1-{index}"
        assert len(child["nonce"]) == 32 and int(child["nonce"], 16) >= 0
        assert child["sha256"] == hashlib.sha256(rig.fake.batch_input(name)).hexdigest()
        assert child["model"] == f"models/{MODEL}"  # as Gemini names the expired batch's
    for name in created:
        rig.finish(name, [answered(k) for k in rig.child_keys(name)])
    assert rig.run().final == 1
    final, by_key = rig.final(root)
    assert final["rows"]["answered"] == 7 and final["attempts"] == 4
    assert {v["attempt"] for v in by_key.values()} == {1}


def test_a_whole_resubmit_split_by_max_rows_is_cut_from_verified_bytes(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Split files are cut from the member's input as its bytes are hashed: a kept input
    swapped after it was kept plans nothing (retry unavailable), no file is uploaded."""
    monkeypatch.setenv("OPSTATE_RETRY_MAX_ROWS", "2")
    keys = ["a", "b", "c"]
    root = rig.submit(keys, "--resubmit-expired")
    rig.fake.set_batch_state(root, "BATCH_STATE_EXPIRED")
    settle(rig.cli, root)
    held = rig.fake.files_held()
    swap(kept_path(rig, root), keys)
    result = rig.run()
    assert (result.planned, result.submitted, result.unavailable) == (0, 0, 1)
    assert rig.fake.batches_created() == [root] and rig.fake.files_held() == held
    doc = rig.state(root).doc
    assert not doc.get("children")
    assert "no longer has its recorded sha256" in doc["unavailableDetail"]


def test_children_of_two_parents_in_one_attempt_get_files_of_their_own(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two members of one generation both with keys to retry: each child's file is its own
    (the second parent's files never overwrite the first's)."""
    monkeypatch.setenv("OPSTATE_RETRY_MAX_ROWS", "2")
    keys = [f"k{i}" for i in range(4)]
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys])
    assert rig.run().submitted == 2
    first = rig.fake.batches_created()[1:]
    assert [rig.child_keys(n) for n in first] == [keys[0:2], keys[2:4]]
    for name in first:
        rig.finish(name, [failed(k, 503, "UNAVAILABLE") for k in rig.child_keys(name)][:1])
    assert rig.run().submitted == 2
    second = rig.fake.batches_created()[3:]
    assert [rig.child_keys(n) for n in second] == [[keys[0]], [keys[2]]]


def strict(line: bytes) -> Any:
    """A line read by a strict JSON parser: UTF-8, no NaN/Infinity, no lone surrogate."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    value = json.loads(line.decode("utf-8"), parse_constant=refuse)
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate cannot encode
    return value


def test_final_jsonl_is_written_and_strict_whatever_rows_the_output_holds(rig: Rig) -> None:
    keys = ["k1", "k2", "k3", "k4"]
    root = rig.submit(keys, "--retry-attempts", "1")
    rows = [
        b'{"key": "k1", "response": {"candidates": [{"content": {"parts": [{"text": '
        b'"\\ud800"}]}}]}}',
        b'{"key": "k2", "response": {"candidates": [], "x": NaN}}',
        b'{"key": "k3", "response": {"candidates": [{"avgLogprobs": 1e400, "content": {}}]}}',
        json.dumps(answered("k4")).encode(),
    ]
    rig.finish(root, b"\n".join(rows) + b"\n")
    assert rig.run().final == 1
    final = rig.state(root).doc["final"]
    data = Path(str(final["location"]).removeprefix("file://")).read_bytes()
    by_key = {strict(line)["key"]: strict(line) for line in data.splitlines()}
    assert sorted(by_key) == keys
    assert by_key["k1"]["error"]["code"] == "missing" and "response" in by_key["k4"]
    assert b'"avgLogprobs": 1e400' in data  # kept as written
    ledger = json.loads(
        Path(str(final["location"]).removeprefix("file://")).with_name("final.json").read_text()
    )
    assert (ledger["unreadable"], ledger["foreign"]) == (2, 0)
    assert ledger["rows"] == {"total": 4, "answered": 2, "blocked": 0, "failed": 2}
