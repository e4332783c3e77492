"""The retry engine under refusal and limits (issue 33): a create refused for money stops the
lineage once and for all, a 503 on create is searched for and retried later; pending timeouts
read the job before cancelling it; the row, batch, attempt and per-reason bounds.

Every pass runs ``retry_once`` in-process on the embedded SQLite store, the results folder and
the real google-genai client talking to the fake Gemini, with a clock the test sets. The
batches are submitted, refreshed and archived through the CLI (``test_retry_scenario``'s
helpers). ``test_retry_engine_faults`` holds the races, store faults and hostile outputs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate import observability
from opstate.config import settings
from opstate.domain.states import State
from opstate.gemini.client import make_client
from opstate.outcomes.wiring import results_url_for, sink_from_url
from opstate.retry import children as children_module
from opstate.retry import lineage
from opstate.retry import passes as passes_module
from opstate.retry.engine import retry_once
from opstate.retry.passes import RetryResult
from opstate.retry.wiring import config_from
from opstate.store.retry_state import RETRY_DONE, RetryState
from opstate.store.sqlite import SQLiteStore
from tests.integration.test_retry_scenario import ok, settle
from tests.support.cli import in_process
from tests.support.fake_gemini import FakeGemini, Request
from tests.support.retry_rows import answered, failed, write_input

MODEL = "gemini-2.5-flash"
S = 1_000_000_000
HOUR = 3600 * S
CREATE_VERB = "batchGenerateContent"


class Rig:
    """A SQLite store file, a results folder and the fake Gemini; the CLI to submit and settle
    batches, ``run`` for one engine pass at a chosen time."""

    def __init__(self, cli: Callable[..., Any], fake: FakeGemini, tmp_path: Path) -> None:
        self.cli = cli
        self.fake = fake
        self.tmp_path = tmp_path
        self.db = tmp_path / "ops.db"
        self.inputs = 0

    def submit(self, keys: list[str], *flags: str) -> str:
        self.inputs += 1
        source = write_input(self.tmp_path / f"in-{self.inputs}.jsonl", keys)
        answer = ok(self.cli("submit", str(source), "--model", MODEL, *flags, "--json"))
        name: str = answer.json()["name"]
        return name

    def finish(self, name: str, rows: list[dict[str, Any]] | bytes) -> None:
        """Batch ``name`` ends with ``rows``; refreshed and archived."""
        self.fake.run_batch(name, rows)
        settle(self.cli, name)

    def run(
        self,
        at_ns: int | None = None,
        *,
        wrap: Callable[[SQLiteStore], Any] | None = None,
        names: list[str] | None = None,
        every: bool = True,
    ) -> RetryResult:
        """One pass at ``at_ns`` (now when None) over every active root (``every``)."""
        current = settings()
        store = SQLiteStore(str(self.db))
        client = make_client(current, timeout_s=30)
        try:
            return retry_once(
                wrap(store) if wrap is not None else store,
                sink_from_url(results_url_for(current), current),
                client,
                config_from(current),
                clock_ns=(lambda: at_ns) if at_ns is not None else time.time_ns,
                names=names,
                every=every,
            )
        finally:
            client.close()
            store.close()
            settings.cache_clear()

    def store(self) -> SQLiteStore:
        return SQLiteStore(str(self.db))

    def state(self, name: str) -> RetryState:
        store = self.store()
        try:
            state = store.get_retry(name)
        finally:
            store.close()
        assert state is not None
        return state

    def created_ns(self, name: str) -> int:
        store = self.store()
        try:
            record = store.get(name)
        finally:
            store.close()
        assert record is not None
        return record.created_ns

    def final(self, root: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """The root's final view (its retry doc's ``final``) and final.jsonl by key (one line
        per key: a second line of a key fails the test)."""
        final = dict(self.state(root).doc["final"])
        assert final["status"] == "final"
        data = Path(str(final["location"]).removeprefix("file://")).read_bytes()
        by_key: dict[str, dict[str, Any]] = {}
        for line in data.splitlines():
            value = json.loads(line)
            assert value["key"] not in by_key, value["key"]
            by_key[value["key"]] = value
        return final, by_key

    def child_keys(self, name: str) -> list[str]:
        return [json.loads(line)["key"] for line in self.fake.batch_input(name).splitlines()]

    def requests(self) -> list[Request]:
        return list(self.fake.requests)


def make_rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake: FakeGemini
) -> Iterator[Rig]:
    monkeypatch.chdir(tmp_path)
    for key in ("OPSTATE_TABLE_NAME", "OPSTATE_WEBHOOK_SECRETS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPSTATE_RECONCILE_MAX_PAGES", "0")
    monkeypatch.setenv("OPSTATE_STORE", f"sqlite:///{tmp_path / 'ops.db'}")
    monkeypatch.setenv("OPSTATE_RESULTS_URL", (tmp_path / "results").as_uri())
    settings.cache_clear()
    yield Rig(in_process(monkeypatch, capsys), fake, tmp_path)
    settings.cache_clear()


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


def creates(requests: list[Request]) -> list[Request]:
    return [r for r in requests if r.method == "POST" and r.verb == CREATE_VERB]


def listings(requests: list[Request]) -> list[Request]:
    return [r for r in requests if r.method == "GET" and r.name == "batches"]


# -- 1. a refused create ---------------------------------------------------------------------


def test_a_create_refused_for_money_stops_the_lineage_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[str] = []
    said: list[str] = []
    real_log = observability.log_fields
    monkeypatch.setattr(children_module, "count", lambda name, *a, **k: counted.append(name))
    monkeypatch.setattr(passes_module, "count", lambda name, *a, **k: counted.append(name))

    def log(level: Any, message: str, fields: Any, **kw: Any) -> None:
        said.append(message)
        real_log(level, message, fields, **kw)

    monkeypatch.setattr(children_module, "log_fields", log)
    monkeypatch.setattr(passes_module, "log_fields", log)  # passes.said_stopped says the stop
    keys = [f"k{i}" for i in range(5)]
    root = rig.submit(keys, "--retry-attempts", "3")
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys[:2]] + [answered(keys[2])])
    # a money refusal (issue 39): Gemini's 402 for depleted prepayment credits (the body:
    # tests/fixtures/gemini_errors/prepay_depleted_402.json)
    quota = "Your prepayment credits are depleted."
    rig.fake.fail_create(402, quota, times=None)
    rig.fake.reset_requests()
    now = time.time_ns()
    first = rig.run(now)
    assert (first.planned, first.stopped, first.submitted, first.final) == (1, 1, 0, 1)
    assert counted == ["RetryStopped"] and said.count("retry lineage stopped") == 1
    state = rig.state(root)
    assert state.status == RETRY_DONE
    assert quota in state.doc["stopped"]
    (entry,) = state.doc["children"]
    assert entry["phase"] == lineage.REFUSED and entry["name"] is None
    # Later passes, even long after any claim ran out, create nothing and say nothing.
    rig.fake.fail_create(402, quota, times=None)
    for later in (now, now + 2 * HOUR, now + 48 * HOUR):
        assert rig.run(later).as_dict() == RetryResult().as_dict()
    assert rig.fake.batches_created() == [root]
    assert len(creates(rig.requests())) == 1
    assert counted == ["RetryStopped"] and said.count("retry lineage stopped") == 1
    assert rig.state(root) == state
    final, by_key = rig.final(root)
    assert final["rows"] == {"total": 5, "answered": 1, "blocked": 0, "failed": 4}
    assert final["errors"] == {"503": 2, "missing": 2}
    assert [by_key[k]["error"]["code"] for k in keys[:2]] == [503, 503]
    assert {by_key[k]["attempt"] for k in keys} == {0}


def test_a_503_on_create_is_searched_for_then_created_after_its_retry_time(rig: Rig) -> None:
    keys = [f"k{i}" for i in range(4)]
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys[:3]] + [answered(keys[3])])
    rig.fake.fail_create(503, "The service is currently unavailable.", times=1)
    now = time.time_ns()
    first = rig.run(now)
    assert (first.planned, first.submitted, first.stopped, first.errors) == (1, 0, 0, 1)
    (entry,) = rig.state(root).doc["children"]
    assert entry["phase"] == lineage.CREATING and "unavailable" in entry["error"]
    check_s = config_from(settings()).check_s
    settings.cache_clear()
    assert entry["claimUntilNs"] == now + int(check_s * S)
    assert not rig.state(root).doc.get("stopped")
    # Before its retry time: left alone.
    rig.fake.reset_requests()
    assert rig.run(now + int(check_s * S) - 1).submitted == 0
    assert creates(rig.requests()) == [] and listings(rig.requests()) == []
    # After it: looked for by its id first (the refused create might have made it), then made.
    second = rig.run(now + int(check_s * S) + 1)
    assert (second.submitted, second.errors) == (1, 0)
    requests = rig.requests()
    (create,) = creates(requests)
    assert listings(requests) and requests.index(listings(requests)[0]) < requests.index(create)
    created = rig.fake.batches_created()
    assert len(created) == 2
    (entry,) = rig.state(root).doc["children"]
    assert (entry["phase"], entry["name"], entry["claims"]) == (lineage.CREATED, created[1], 2)
    assert rig.child_keys(created[1]) == keys[:3]


# -- 2. pending timeouts ---------------------------------------------------------------------


def job_requests(rig: Rig, name: str) -> list[tuple[str, str | None]]:
    return [(r.method, r.verb) for r in rig.requests() if r.name == name]


def test_a_member_pending_past_its_timeout_is_read_then_cancelled_and_resubmitted_once(
    rig: Rig,
) -> None:
    keys = [f"k{i}" for i in range(4)]
    root = rig.submit(keys, "--pending-timeout-hours", "1")
    source = rig.fake.batch_input(root)
    now = time.time_ns()
    rig.fake.reset_requests()
    assert rig.run(now + HOUR // 2).cancelled == 0  # not yet
    assert job_requests(rig, root) == []
    late = rig.run(now + 2 * HOUR)
    assert (late.cancelled, late.waiting) == (1, 1)
    assert job_requests(rig, root) == [("GET", None), ("POST", "cancel")]
    assert rig.state(root).doc["cancelled"] == [root]
    assert rig.run(now + 3 * HOUR).cancelled == 0  # asked once
    assert job_requests(rig, root) == [("GET", None), ("POST", "cancel")]
    settle(rig.cli, root)  # Gemini says CANCELLED now
    resubmit = rig.run(now + 3 * HOUR)
    assert (resubmit.planned, resubmit.submitted) == (1, 1)
    created = rig.fake.batches_created()
    assert len(created) == 2 and rig.fake.batch_input(created[1]) == source
    (entry,) = rig.state(root).doc["children"]
    assert (entry["whole"], entry["attempt"], entry["parent"]) == (True, 1, root)
    assert rig.run().submitted == 0  # the child is young: neither cancelled nor made again
    rig.finish(created[1], [answered(k) for k in keys])
    assert rig.run().final == 1
    assert rig.fake.batches_created() == created
    final, by_key = rig.final(root)
    assert final["rows"] == {"total": 4, "answered": 4, "blocked": 0, "failed": 0}
    assert {v["attempt"] for v in by_key.values()} == {1}


def test_a_job_running_by_its_timeout_is_ingested_not_cancelled(rig: Rig) -> None:
    keys = ["a", "b"]
    root = rig.submit(keys, "--pending-timeout-hours", "1", "--retry-attempts", "1")
    rig.fake.set_batch_state(root, "BATCH_STATE_RUNNING")  # the store still says PENDING
    rig.fake.reset_requests()
    result = rig.run(time.time_ns() + 2 * HOUR)
    assert (result.cancelled, result.waiting) == (0, 1)
    assert job_requests(rig, root) == [("GET", None)]
    store = rig.store()
    try:
        record = store.get(root)
        assert record is not None and record.state is State.RUNNING
    finally:
        store.close()
    assert not rig.state(root).doc.get("cancelled")
    assert rig.run(time.time_ns() + 3 * HOUR).cancelled == 0
    assert job_requests(rig, root) == [("GET", None)]  # RUNNING in the store: not read again


def test_a_cancelled_job_that_succeeds_anyway_counts_and_nothing_is_resubmitted(
    rig: Rig,
) -> None:
    keys = ["a", "b", "c"]
    root = rig.submit(keys, "--pending-timeout-hours", "1", "--retry-attempts", "1")
    assert rig.run(time.time_ns() + 2 * HOUR).cancelled == 1
    rig.finish(root, [answered(k) for k in keys])  # it had finished before the cancel took
    result = rig.run(time.time_ns() + 2 * HOUR)
    assert (result.planned, result.submitted, result.final) == (0, 0, 1)
    assert rig.fake.batches_created() == [root]
    final, by_key = rig.final(root)
    assert final["rows"] == {"total": 3, "answered": 3, "blocked": 0, "failed": 0}
    assert set(by_key) == set(keys)


# -- 3. bounds -------------------------------------------------------------------------------


def test_max_rows_splits_the_keys_over_several_children_of_one_attempt(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPSTATE_RETRY_MAX_ROWS", "3")
    keys = [f"k{i}" for i in range(10)]
    root = rig.submit(keys, "--retry-attempts", "1")
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys[:7]] + [answered(keys[7])])
    result = rig.run()
    assert (result.planned, result.submitted) == (3, 3)
    ids = [c["id"] for c in rig.state(root).doc["children"]]
    nonces = [c["nonce"] for c in rig.state(root).doc["children"]]
    # Each id carries its own random nonce (issue 38: nobody can guess it beforehand).
    assert ids == [f"opstate-{nonce}-a1-{n}" for n, nonce in enumerate(nonces)]
    assert len(set(nonces)) == 3 and all(len(n) == 32 for n in nonces)
    assert {c["attempt"] for c in rig.state(root).doc["children"]} == {1}
    created = rig.fake.batches_created()[1:]
    shown = [(rig.fake.resource(n) or {})["metadata"]["displayName"] for n in created]
    assert shown == [lineage.public_name(i) for i in ids]  # no part of the nonce (issue 47)
    assert [rig.child_keys(n) for n in created] == [keys[0:3], keys[3:6], keys[6:7]]
    for name in created:
        rig.finish(name, [answered(k) for k in rig.child_keys(name)])
    assert rig.run().final == 1
    final, _ = rig.final(root)
    assert final["rows"]["answered"] == 8 and final["attempts"] == 4 and final["retried"] == 7


def test_max_batches_caps_the_children_and_the_rest_stays_failed_in_final(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPSTATE_RETRY_MAX_ROWS", "3")
    monkeypatch.setenv("OPSTATE_RETRY_MAX_BATCHES", "2")
    keys = [f"k{i}" for i in range(10)]
    root = rig.submit(keys, "--retry-attempts", "3")
    rig.finish(
        root, [failed(k, 503, "UNAVAILABLE") for k in keys[:7]] + [answered(k) for k in keys[7:]]
    )
    assert rig.run().submitted == 2
    created = rig.fake.batches_created()[1:]
    assert [rig.child_keys(n) for n in created] == [keys[0:3], keys[3:6]]
    rig.finish(created[0], [failed(keys[0], 503, "UNAVAILABLE")] + [answered(k) for k in keys[1:3]])
    rig.finish(created[1], [answered(k) for k in keys[3:6]])
    last = rig.run()
    assert (last.planned, last.submitted, last.final) == (0, 0, 1)  # no room for an attempt 2
    assert len(rig.fake.batches_created()) == 3
    final, by_key = rig.final(root)
    assert final["rows"] == {"total": 10, "answered": 8, "blocked": 0, "failed": 2}
    assert (by_key["k6"]["error"]["code"], by_key["k6"]["attempt"]) == (503, 0)
    assert (by_key["k0"]["error"]["code"], by_key["k0"]["attempt"]) == (503, 1)


def test_max_attempts_bounds_each_key(rig: Rig) -> None:
    keys = ["a", "b", "c"]
    root = rig.submit(keys, "--retry-attempts", "1")
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys[:2]] + [answered("c")])
    assert rig.run().submitted == 1
    child = rig.fake.batches_created()[1]
    rig.finish(child, [failed("a", 503, "UNAVAILABLE"), answered("b")])
    result = rig.run()
    assert (result.planned, result.final) == (0, 1)
    assert len(rig.fake.batches_created()) == 2
    final, by_key = rig.final(root)
    assert (by_key["a"]["error"]["code"], by_key["a"]["attempt"]) == (503, 1)
    assert final["errors"] == {"503": 1} and final["attempts"] == 2


def test_internal_and_deadline_are_retried_once_unavailable_again(rig: Rig) -> None:
    keys = ["i500", "i13", "d504", "d4", "u503", "ok"]
    codes = {
        "i500": (500, "INTERNAL"),
        "i13": (13, "INTERNAL"),
        "d504": (504, "DEADLINE_EXCEEDED"),
        "d4": (4, "DEADLINE_EXCEEDED"),
        "u503": (503, "UNAVAILABLE"),
    }
    root = rig.submit(keys, "--retry-attempts", "3")
    failures = [failed(k, *codes[k]) for k in keys[:5]]
    rig.finish(root, [*failures, answered("ok")])
    assert rig.run().submitted == 1
    child = rig.fake.batches_created()[1]
    assert rig.child_keys(child) == keys[:5]
    rig.finish(child, failures)  # the same failures again
    assert rig.run().submitted == 1
    grandchild = rig.fake.batches_created()[2]
    assert rig.child_keys(grandchild) == ["u503"]  # INTERNAL and DEADLINE: once each
    rig.finish(grandchild, [answered("u503")])
    assert rig.run().final == 1
    final, by_key = rig.final(root)
    assert final["errors"] == {"500": 1, "13": 1, "504": 1, "4": 1}
    assert {by_key[k]["attempt"] for k in keys[:4]} == {1}
    assert by_key["u503"]["attempt"] == 2 and "response" in by_key["u503"]


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (429, "Your prepayment credits are depleted."),
        (429, "Billing account disabled"),
        (8, "Your spending cap is reached"),
    ],
)
def test_a_row_naming_money_is_never_retried_and_stops_the_lineage(
    rig: Rig, code: int, message: str
) -> None:
    # Issue 39: a money refusal is permanent and stops the lineage; the rate-limited row beside
    # it is not retried either, since a create would be refused for the same money.
    keys = ["money", "rate", "fine"]
    root = rig.submit(keys, "--retry-attempts", "3")
    rows = [
        {"key": "money", "error": {"code": code, "message": message}},
        {"key": "rate", "error": {"code": 429, "message": "Too many requests, slow down"}},
        answered("fine"),
    ]
    rig.finish(root, rows)
    result = rig.run()
    assert (result.submitted, result.stopped, result.final) == (0, 1, 1)
    assert message in rig.state(root).doc["stopped"]
    final, by_key = rig.final(root)
    expected = {"429": 2} if code == 429 else {"8": 1, "429": 1}
    assert final["errors"] == expected
    assert {by_key[k]["attempt"] for k in ("money", "rate")} == {0}
    assert len(rig.fake.batches_created()) == 1
