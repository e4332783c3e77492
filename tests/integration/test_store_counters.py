"""The store's counters (issue 41, ``store.counters``) on every store: an add under a cap is
atomic (racing runners never pass it together), a counter is no record (no listing, due
query or notifier announces it), and the daily retry budget holds across lineages on each
store (``retry.spend``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.ingest import ingest
from opstate.notify.entries import build_entry
from opstate.outcomes.estimate import estimate_rows
from opstate.retry import budget as budget_module
from opstate.retry import passes, spend
from opstate.retry.lineage import MemberRef
from opstate.retry.passes import RetryConfig, RetryResult
from opstate.retry.rules import parse_table
from opstate.store.counters import RESERVED_PREFIX, CountingStore
from opstate.store.port import ArchiveState
from opstate.store.retry_state import RetryState
from opstate.store.sqlite import SQLiteStore
from tests.support.stores import STORE_KINDS, Harness, harness_of

S = 1_000_000_000
T0 = parse_time("2026-06-01T10:00:00Z")
NOW_NS = T0 + 3600 * S


@pytest.fixture(params=STORE_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_of(request, tmp_path, clock=lambda: NOW_NS) as h:
        yield h


def counting(h: Harness) -> CountingStore:
    assert isinstance(h.store, CountingStore)
    return h.store


def test_a_counter_adds_up_to_its_cap_and_never_past_it(harness: Harness) -> None:
    store = counting(harness)
    assert store.get_counter("c") == 0
    assert store.add_counter("c", 40, 100) and store.add_counter("c", 60, 100)
    assert not store.add_counter("c", 1, 100)
    assert store.get_counter("c") == 100
    assert not store.add_counter("other", 101, 100) and store.get_counter("other") == 0
    assert store.add_counter("other", 0, 0)
    with pytest.raises(ValueError):
        store.add_counter("c", -1, 100)


def test_racing_adds_never_pass_the_cap(harness: Harness) -> None:
    if harness.kind == "dynamodb-mock":
        pytest.skip("moto in-process: conditional writes are not atomic")
    store = counting(harness)
    results: list[bool] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def add() -> None:
        start.wait()
        for _ in range(5):
            done = store.add_counter("race", 7, 100)
            with lock:
                results.append(done)

    threads = [threading.Thread(target=add) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(True) == 100 // 7
    assert store.get_counter("race") == 7 * (100 // 7)


def test_a_counter_is_no_record(harness: Harness) -> None:
    store = counting(harness)
    ingest(
        harness.store,
        OpEvent("batches/a", State.RUNNING, T0, "report", {}),
        clock_ns=lambda: NOW_NS,
    )
    assert store.add_counter("retry-spend-nano-usd:2026-06-01", 5, 10)
    listed = [r.name for r in harness.store.iter_all()]
    assert listed == ["batches/a"]
    assert [r.name for r in harness.store.list_open()] == ["batches/a"]
    store_any: Any = harness.store
    assert list(store_any.iter_archive_due(NOW_NS * 2)) == []
    assert list(store_any.iter_retry_due(NOW_NS * 2)) == []
    assert list(store_any.iter_marked()) == []
    if harness.kind.startswith("dynamodb"):
        item = harness.raw(RESERVED_PREFIX + "retry-spend-nano-usd:2026-06-01")
        assert item is not None and set(item) == {"name", "value"}


def counter_stream_record(event_name: str) -> DynamoDBRecord:
    key = {"name": {"S": RESERVED_PREFIX + "retry-spend-nano-usd:2026-06-01"}}
    image = {**key, "value": {"N": "5"}}
    dynamodb: dict[str, Any] = {
        "Keys": key,
        "NewImage": image,
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    }
    if event_name == "MODIFY":
        dynamodb["OldImage"] = {**key, "value": {"N": "2"}}
    return DynamoDBRecord({"eventName": event_name, "dynamodb": dynamodb})


@pytest.mark.parametrize("event_name", ["INSERT", "MODIFY"])
def test_the_notifier_announces_no_counter(event_name: str) -> None:
    assert build_entry(counter_stream_record(event_name), "bus") is None


# -- the daily retry budget across lineages ----------------------------------------------------


# A planned retry batch's input: 4 rows of gemini-2.0-flash allowed 5,000 output tokens each.
PLANNED_INPUT = b"".join(
    b'{"key": "k%d", "request": {"contents": [{"parts": [{"text": "q"}]}], '
    b'"generationConfig": {"maxOutputTokens": 5000}}}\n' % i
    for i in range(4)
)


@dataclass
class StubSink:
    """What ``spend`` reads of the sink: a planned child's input."""

    def chunks(self, location: str) -> list[bytes]:
        assert location == "mem://c"
        return [PLANNED_INPUT]


@dataclass
class StubRunner:
    """What ``spend.check`` and ``budget.Budget`` use of a runner."""

    store: Any
    config: RetryConfig
    result: RetryResult = field(default_factory=RetryResult)
    clock_ns: Any = lambda: NOW_NS
    sink: Any = field(default_factory=StubSink)


def planned_bound() -> Decimal:
    """At most what ``plan``'s child costs (issue 47: from its own rows)."""
    when = datetime.fromtimestamp(NOW_NS / 1e9, tz=UTC)
    found = estimate_rows([PLANNED_INPUT], "models/gemini-2.0-flash", when=when)
    assert found.usd is not None
    return found.usd


def priced_archive(usd: str, rows: int) -> ArchiveState:
    cost = {
        "usd": usd,
        "model": "gemini-2.0-flash",
        "prices": "genai-prices 0.2.5",
        "batch_discount": {"by": "opstate", "factor": "0.5"},
    }
    bands = [{"model": "gemini-2.0-flash", "band": 0, "rows": rows, "usage": {}}]
    return ArchiveState(
        "archived", created_ns=1, summary={"rows": {}, "usageBands": bands, "cost": cost}
    )


def plan(rows: int) -> list[dict[str, Any]]:
    return [
        {
            "id": "c",
            "rows": rows,
            "phase": "planned",
            "input": "mem://c",
            "model": "models/gemini-2.0-flash",
        }
    ]


def test_the_daily_budget_holds_across_lineages_on_every_store(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spend, "count", lambda *a, **k: None)
    monkeypatch.setattr(passes, "count", lambda *a, **k: None)
    # A retry of 4 rows is bounded by its own rows: $0.00402 (20,000 output tokens at
    # $0.20 / 1M, 4 short lines at $0.05 / 1M), whatever the root cost.
    bound = planned_bound()
    assert Decimal("0.004") < bound < Decimal("0.005")
    config = RetryConfig(table=parse_table("UNAVAILABLE"), daily_budget_usd=0.01)
    runner = StubRunner(harness.store, config)
    allowed = []
    for n in range(4):
        root = f"batches/root-{n}"
        doc: dict[str, Any] = {"policy": {"maxAttempts": 2}}
        planned = plan(4)
        archives = {root: priced_archive("0.01", 10)}
        ok = spend.check(
            runner, _record(root), doc, [MemberRef(root, 0, None, 14, 0)], archives, planned
        )
        allowed.append(ok)
        if not ok:
            assert "OPSTATE_RETRY_DAILY_BUDGET_USD" in doc["stopped"]
            assert planned[0]["phase"] == "refused"
            spend.said(runner, _record(root), doc["stopped"])  # the engine, once it is written
    assert allowed == [True, True, False, False]  # two bounds fit; a third would pass $0.01
    counter = spend.DAILY_COUNTER.format(day="2026-06-01")
    assert Decimal(counting(harness).get_counter(counter)) / spend.NANO == 2 * bound
    assert runner.result.stopped == 2


def _record(name: str) -> Any:
    from opstate.domain.model import OpRecord

    return OpRecord(name, State.SUCCEEDED, T0, 1, "report", {}, created_ns=1)


def test_a_lineage_cap_needs_no_counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spend, "count", lambda *a, **k: None)
    store = SQLiteStore(tmp_path / "s.db")
    try:
        runner = StubRunner(store, RetryConfig(table=parse_table("UNAVAILABLE")))
        most = float(Decimal("0.01") + planned_bound())
        doc: dict[str, Any] = {"policy": {"maxAttempts": 2, "maxCostUSD": most - 1e-6}}
        archives = {"batches/r": priced_archive("0.01", 10)}
        refs = [MemberRef("batches/r", 0, None, 14, 0)]
        # $0.01 so far + the planned rows' bound: just over the cap
        assert not spend.check(runner, _record("batches/r"), doc, refs, archives, plan(4))
        assert "maxCostUSD" in doc["stopped"] and "$0.010000" in doc["stopped"]
        doc = {"policy": {"maxAttempts": 2, "maxCostUSD": most}}
        assert spend.check(runner, _record("batches/r"), doc, refs, archives, plan(4))
        assert store.get_counter(spend.DAILY_COUNTER.format(day="2026-06-01")) == 0
    finally:
        store.close()


def test_the_batches_per_hour_bound_is_a_counter_on_every_store(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: the hour's retry batches are a store counter, taken one at a time under the
    bound, per UTC clock hour; two budgets (two runners) share it."""
    monkeypatch.setattr(budget_module, "count", lambda *a, **k: None)
    config = RetryConfig(table=parse_table("UNAVAILABLE"), max_batches_per_hour=2)
    clock = [NOW_NS]
    runner = StubRunner(harness.store, config, clock_ns=lambda: clock[0])
    one, two = budget_module.Budget(runner), budget_module.Budget(runner)
    taken = [b.allows(_record(f"batches/r{i}")) for i, b in enumerate([one, two, one, two])]
    assert taken == [True, True, False, False]
    hour = budget_module.HOUR_COUNTER.format(hour="2026-06-01T11")
    assert counting(harness).get_counter(hour) == 2
    clock[0] = NOW_NS + 3600 * S  # the next clock hour
    assert budget_module.Budget(runner).allows(_record("batches/r9"))


def test_a_priced_archive_reads_back_on_every_store(harness: Harness) -> None:
    """The summary's bands (a null model among them) and its cost (exact decimal text, a
    nested map, a null) round-trip through every store into ``results --json``'s cost."""
    from opstate.domain.costs import cost_view
    from opstate.outcomes.results import results_json

    name = "batches/priced"
    ingest(harness.store, OpEvent(name, State.SUCCEEDED, T0, "report", {}), clock_ns=lambda: NOW_NS)
    record = harness.store.get(name)
    assert record is not None
    cost = {
        "usd": "0.000360000000000000000000000001",
        "model": "gemini-2.0-flash",
        "priced_at": "2026-06-01T11:00:00.000000000Z",
        "prices": "genai-prices 0.2.5",
        "batch_discount": {"by": "opstate", "factor": "0.5"},
    }
    bands = [
        {"model": None, "band": 0, "rows": 3, "usage": {"promptTokenCount": 3600}},
        {"model": "gemini-2.0-flash", "band": 3, "rows": 1, "usage": {"promptTokenCount": 2**62}},
        {  # issue 47: per-modality sums, a nested map of maps
            "model": "gemini-3-pro-image-preview",
            "band": 0,
            "rows": 8,
            "usage": {"promptTokenCount": 160, "candidatesTokenCount": 8960},
            "modalities": {
                "promptTokensDetails": {"TEXT": 160},
                "candidatesTokensDetails": {"IMAGE": 8960},
            },
        },
    ]
    summary = {"rows": {"total": 4}, "usageBands": bands, "cost": cost}
    state = ArchiveState("archived", created_ns=record.created_ns, summary=summary)
    store: Any = harness.store
    assert store.set_archive(name, 0, state)
    stored = store.get_archive(name)
    assert stored.summary["usageBands"] == bands and stored.summary["cost"] == cost
    view = results_json(harness.store, name)
    assert view is not None and view["cost"] == cost_view(cost)
    assert view["cost"]["usd"] == 0.00036


@dataclass
class WritingRunner(StubRunner):
    """A runner whose writes are kept here (``spend.charge`` writes the plan once charged)."""

    writes: list[dict[str, Any]] = field(default_factory=list)

    def write(self, root: Any, state: RetryState, doc: Any) -> RetryState:
        self.writes.append(dict(doc))
        return replace(state, doc=dict(doc), rev=state.rev + 1)


def test_an_archived_child_is_charged_beyond_its_bound_once_on_every_store(
    harness: Harness,
) -> None:
    """Issue 47: a child reserved $0.000000100 and really cost $0.00036: the difference is
    added to the day it reserved in, once, even over the daily cap (what was spent is spent)."""
    counter = spend.DAILY_COUNTER.format(day="2026-06-01")
    assert counting(harness).add_counter(counter, 100, 100)
    child = {
        "id": "c",
        "name": "batches/child",
        "phase": "created",
        "boundNanoUsd": 100,
        "reservedIn": counter,
    }
    state = RetryState("active", created_ns=1, doc={"children": [child]})
    runner = WritingRunner(harness.store, RetryConfig(table=parse_table("UNAVAILABLE")))
    archives: dict[str, ArchiveState | None] = {"batches/child": priced_archive("0.00036", 3)}
    state = spend.charge(runner, _record("batches/root"), state, archives)
    assert counting(harness).get_counter(counter) == 360_000
    assert state.doc["children"][0]["charged"] == 360_000
    spend.charge(runner, _record("batches/root"), state, archives)
    assert counting(harness).get_counter(counter) == 360_000 and len(runner.writes) == 1
