"""What a lineage cost and what its retries may spend (issue 41), through the real engine on the
SQLite store, the results folder and the fake Gemini (``test_retry_engine``'s rig).

- a finished lineage's final result (retry doc, ``results --json``, ``final.json``, the
  ``Operation Results Final`` event) carries the sum over every batch, equal to genai-prices'
  price of their tokens at the Batch API price, and what the retries added;
- ``--max-cost-usd`` below what the root already cost: nothing is created, the final result is
  written with the failures kept and says the budget stopped it, counted in RetryStopped;
- ``OPSTATE_RETRY_DAILY_BUDGET_USD`` holds across lineages.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import genai_prices
import pytest

from opstate.domain.costs import BATCH_FACTOR, shown_usd
from opstate.domain.times import format_time
from opstate.notify.entries import (
    RESULTS_ARCHIVED_DETAIL_TYPE,
    RESULTS_FINAL_DETAIL_TYPE,
    results_detail,
    results_final_detail,
)
from opstate.outcomes import run as run_module
from opstate.outcomes.estimate import estimate_rows
from opstate.retry import finalize as finalize_module
from opstate.retry import passes, spend
from opstate.store.sqlite import SQLiteStore
from tests.integration.test_retry_engine import Rig, make_rig
from tests.integration.test_retry_scenario import ok
from tests.support.event_schemas import problems
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import failed, request_bytes

# genai-prices 0.2.5 has no Batch API price of this model: its standard price times 0.5.
PRICED_MODEL = "gemini-2.0-flash"
PROMPT, OUTPUT = 1200, 300


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []
    record = lambda name, *a, **k: names.append(name)  # noqa: E731
    monkeypatch.setattr(spend, "count", record)
    monkeypatch.setattr(passes, "count", record)  # RetryStopped: passes.stop_lineage
    return names


def answered(key: str) -> dict[str, Any]:
    return {
        "key": key,
        "response": {
            "candidates": [{"content": {"parts": [{"text": "a"}]}, "finishReason": "STOP"}],
            "modelVersion": PRICED_MODEL,
            "usageMetadata": {
                "promptTokenCount": PROMPT,
                "candidatesTokenCount": OUTPUT,
                "totalTokenCount": PROMPT + OUTPUT,
            },
        },
    }


def batch_price(rows: int) -> Decimal:
    """What ``rows`` answered rows cost: genai-prices' standard price of their tokens times
    the Batch API factor."""
    usage = genai_prices.Usage(input_tokens=PROMPT * rows, output_tokens=OUTPUT * rows)
    standard = genai_prices.calc_price(usage, PRICED_MODEL, provider_id="google")
    return standard.total_price * BATCH_FACTOR


def results(rig: Rig, name: str) -> dict[str, Any]:
    view: dict[str, Any] = ok(rig.cli("results", name, "--json")).json()
    return view


def final_json(rig: Rig, root: str) -> dict[str, Any]:
    final, _ = rig.final(root)
    location = Path(str(final["location"]).removeprefix("file://"))
    document: dict[str, Any] = json.loads((location.parent / "final.json").read_text())
    return document


def final_event(rig: Rig, root: str) -> dict[str, Any]:
    store = SQLiteStore(str(rig.db))
    try:
        record = store.get(root)
        state = store.get_retry(root)
    finally:
        store.close()
    assert record is not None and state is not None
    detail = results_final_detail(record, state.doc)
    assert problems(RESULTS_FINAL_DETAIL_TYPE, detail) == []
    return detail


def archived_event(rig: Rig, name: str) -> dict[str, Any]:
    """The ``Operation Results Archived`` detail the notifier builds from the stored archive."""
    store = SQLiteStore(str(rig.db))
    try:
        record, archive = store.get(name), store.get_archive(name)
    finally:
        store.close()
    assert record is not None and archive is not None
    detail = results_detail(record, {"archive": archive.as_dict()}, RESULTS_ARCHIVED_DETAIL_TYPE)
    assert problems(RESULTS_ARCHIVED_DETAIL_TYPE, detail) == []
    return detail


def test_a_finished_lineage_costs_every_batch_at_batch_prices_on_every_surface(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics: list[tuple[str, float]] = []
    for module in (run_module, finalize_module):
        monkeypatch.setattr(module, "count", lambda n, v=1, **k: metrics.append((n, v)))
    keys = [f"k{i}" for i in range(6)]
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(
        root, [failed(k, 503, "UNAVAILABLE") for k in keys[:2]] + [answered(k) for k in keys[2:]]
    )
    root_cost = results(rig, root)["cost"]
    assert root_cost["usd"] == shown_usd(batch_price(4))
    assert root_cost["model"] == PRICED_MODEL
    assert root_cost["batch_discount"] == {"by": "opstate", "factor": "0.5"}
    assert root_cost["prices"] == f"genai-prices {genai_prices.__version__}"
    assert archived_event(rig, root)["cost"] == root_cost
    assert ("ResultsCostUSD", float(batch_price(4))) in metrics
    assert rig.run().submitted == 1
    child = rig.fake.batches_created()[1]
    rig.finish(child, [answered(k) for k in keys[:2]])
    assert results(rig, child)["cost"]["usd"] == shown_usd(batch_price(2))
    assert rig.run().final == 1
    total, retries = batch_price(6), batch_price(2)
    final = results(rig, root)["final"]
    assert final["status"] == "final" and final["stopped"] is None
    assert final["cost"]["usd"] == shown_usd(total)
    assert final["cost"]["retries_usd"] == shown_usd(retries)
    document = final_json(rig, root)
    assert Decimal(document["cost"]["usd"]) == total
    assert Decimal(document["cost"]["retries_usd"]) == retries
    event = final_event(rig, root)
    assert event["cost"]["usd"] == shown_usd(total) and event["stopped"] is None
    assert ("RetryCostUSD", float(retries)) in metrics


def test_a_cap_below_what_the_root_cost_creates_nothing_and_the_final_says_why(
    rig: Rig, counted: list[str]
) -> None:
    keys = [f"k{i}" for i in range(5)]
    cap = float(batch_price(3) / 2)  # the root alone costs more
    root = rig.submit(keys, "--retry-attempts", "2", "--max-cost-usd", f"{cap!r}")
    rig.finish(
        root, [failed(k, 503, "UNAVAILABLE") for k in keys[:2]] + [answered(k) for k in keys[2:]]
    )
    passed = rig.run()
    assert (passed.submitted, passed.stopped, passed.final) == (0, 1, 1)
    assert rig.fake.batches_created() == [root]
    assert counted == ["RetryStopped", "RetryBudgetStopped"]
    state = rig.state(root)
    assert state.doc["policy"]["maxCostUSD"] == cap
    (entry,) = state.doc["children"]
    assert entry["phase"] == "refused" and entry["error"] == spend.REFUSED_ERROR
    why = state.doc["stopped"]
    assert why.startswith(spend.STOP_PREFIX) and "maxCostUSD" in why
    final, by_key = rig.final(root)
    assert final["rows"] == {"total": 5, "answered": 3, "blocked": 0, "failed": 2}
    assert [by_key[k]["error"]["code"] for k in keys[:2]] == [503, 503]
    view = results(rig, root)
    assert view["final"]["stopped"] == why
    assert view["final"]["cost"]["usd"] == shown_usd(batch_price(3))
    assert view["final"]["cost"]["retries_usd"] == 0.0
    retry_view = ok(rig.cli("get", root, "--json")).json()["retry"]
    assert retry_view["reason"] == why and retry_view["policy"]["maxCostUSD"] == cap
    assert final_json(rig, root)["stopped"] == why
    assert final_event(rig, root)["stopped"] == why
    # Later passes create nothing and say nothing more.
    assert rig.run().stopped == 0 and rig.fake.batches_created() == [root]


def bound(keys: list[str], model: str = "gemini-2.5-flash") -> Decimal:
    """At most what a retry batch of ``keys``' request lines costs (issue 47)."""
    found = estimate_rows([b"".join(request_bytes(k) for k in keys)], model)
    assert found.usd is not None, found
    return found.usd


@pytest.mark.parametrize(("room", "created"), [(Decimal(0), 1), (Decimal("-0.000001"), 0)])
def test_a_cap_with_room_for_the_bound_creates_the_retry(
    rig: Rig, counted: list[str], room: Decimal, created: int
) -> None:
    keys = [f"k{i}" for i in range(5)]
    cap = float(batch_price(3) + bound(keys[:2]) + room)
    root = rig.submit(keys, "--retry-attempts", "2", "--max-cost-usd", f"{cap!r}")
    rig.finish(
        root, [failed(k, 503, "UNAVAILABLE") for k in keys[:2]] + [answered(k) for k in keys[2:]]
    )
    assert rig.run().submitted == created
    assert counted == ([] if created else ["RetryStopped", "RetryBudgetStopped"])


def submit_rows(rig: Rig, lines: list[dict[str, Any]], model: str, *flags: str) -> str:
    """A batch of these input ``lines`` on ``model`` (``rig.submit`` with requests of its own)."""
    rig.inputs += 1
    source = rig.tmp_path / f"in-{rig.inputs}.jsonl"
    source.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    answer = ok(rig.cli("submit", str(source), "--model", model, *flags, "--json"))
    name: str = answer.json()["name"]
    return name


def test_a_cap_bounds_the_rows_retried_not_the_average_of_those_answered(
    rig: Rig, counted: list[str]
) -> None:
    """The issue's lineage: a 10-token prompt answered beside a 90,000-token one that failed.
    0.6.0 estimated the retry at the answered row's cost (about $0.000002) and created it under
    ``--max-cost-usd 0.00001``; the 90,000 tokens alone cost $0.0135 at the batch price."""
    lines = [
        {"key": "small", "request": {"contents": [{"parts": [{"text": "hello"}]}]}},
        {"key": "big", "request": {"contents": [{"parts": [{"text": "w " * 90_000}]}]}},
    ]
    root = submit_rows(
        rig, lines, "gemini-2.5-flash", "--retry-attempts", "2", "--max-cost-usd", "0.00001"
    )
    small = answered("small")
    small["response"]["modelVersion"] = "gemini-2.5-flash"
    small["response"]["usageMetadata"] = {"promptTokenCount": 10, "candidatesTokenCount": 2}
    rig.finish(root, [small, failed("big", 503, "UNAVAILABLE")])
    passed = rig.run()
    assert (passed.submitted, passed.stopped) == (0, 1)
    assert rig.fake.batches_created() == [root]
    assert "maxCostUSD" in rig.state(root).doc["stopped"]


def test_a_cap_over_an_image_batch_stops_it_at_the_image_price(
    rig: Rig, counted: list[str]
) -> None:
    """Two image requests (maxOutputTokens 1,120: one image) on gemini-3-pro-image-preview,
    one answered, one failed: the lineage has cost one image ($0.0672 at the batch price) and
    the retry may cost another, over a $0.10 cap. 0.6.0 priced the image as text ($0.0067 a
    row) and created the retry."""
    request = {
        "contents": [{"parts": [{"text": "a red cat"}]}],
        "generationConfig": {"maxOutputTokens": 1120, "responseModalities": ["IMAGE"]},
    }
    lines = [{"key": k, "request": request} for k in ("one", "two")]
    model = "gemini-3-pro-image-preview"
    root = submit_rows(rig, lines, model, "--retry-attempts", "2", "--max-cost-usd", "0.10")
    image = answered("one")
    image["response"]["modelVersion"] = model
    image["response"]["usageMetadata"] = {
        "promptTokenCount": 6,
        "candidatesTokenCount": 1120,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 6}],
        "candidatesTokensDetails": [{"modality": "IMAGE", "tokenCount": 1120}],
    }
    rig.finish(root, [image, failed("two", 503, "UNAVAILABLE")])
    assert results(rig, root)["cost"]["usd"] == pytest.approx(0.067206)
    passed = rig.run()
    assert (passed.submitted, passed.stopped) == (0, 1)
    assert "maxCostUSD" in rig.state(root).doc["stopped"]


def test_a_cap_with_an_unknown_cost_creates_nothing_and_says_why(
    rig: Rig, counted: list[str]
) -> None:
    keys = ["a", "b", "c"]
    root = rig.submit(keys, "--retry-attempts", "2", "--max-cost-usd", "5")
    unknown = answered("c")
    unknown["response"]["modelVersion"] = "gemini-99-unknown"
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys[:2]] + [unknown])
    assert results(rig, root)["cost"]["usd"] is None
    passed = rig.run()
    assert (passed.submitted, passed.stopped, passed.final) == (0, 1, 1)
    why = rig.state(root).doc["stopped"]
    assert "gemini-99-unknown" in why and "cannot be bounded" in why
    final = results(rig, root)["final"]
    assert final["cost"]["usd"] is None and root in final["cost"]["reason"]


def test_the_daily_budget_holds_across_lineages(
    rig: Rig, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each lineage: 3 answered rows, 2 to retry, bounded by their own request lines (issue
    # 47). The day's budget has room for one such retry, not two.
    one = bound(["l0-0", "l0-1"])
    monkeypatch.setenv("OPSTATE_RETRY_DAILY_BUDGET_USD", repr(float(one * 3 / 2)))
    roots = []
    for n in range(2):
        keys = [f"l{n}-{i}" for i in range(5)]
        root = rig.submit(keys, "--retry-attempts", "2")
        rig.finish(
            root,
            [failed(k, 503, "UNAVAILABLE") for k in keys[:2]] + [answered(k) for k in keys[2:]],
        )
        roots.append(root)
    first = rig.run(names=[roots[0]], every=False)
    assert first.submitted == 1 and counted == []
    second = rig.run(names=[roots[1]], every=False)
    assert (second.submitted, second.stopped) == (0, 1)
    why = rig.state(roots[1]).doc["stopped"]
    assert "OPSTATE_RETRY_DAILY_BUDGET_USD" in why
    assert len(rig.fake.batches_created()) == 3  # two roots, one retry


def test_an_archived_retry_is_charged_what_it_cost_beyond_its_bound(
    rig: Rig, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: the daily counter kept only what was reserved (0.6.0 never added the real cost
    found at archive). A retry that really cost more than its bound (here Gemini reports a
    10 million prompt tokens for a short line) adds the difference once it is archived."""
    monkeypatch.setenv("OPSTATE_RETRY_DAILY_BUDGET_USD", "10")
    keys = ["a", "b", "c"]
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys[:2]] + [answered("c")])
    now = time.time_ns()
    assert rig.run(now).submitted == 1
    (entry,) = rig.state(root).doc["children"]
    counter = entry["reservedIn"]
    assert counter == spend.DAILY_COUNTER.format(day=format_time(now)[:10])
    store = rig.store()
    try:
        assert store.get_counter(counter) == entry["boundNanoUsd"]
    finally:
        store.close()
    heavy = [answered(k) for k in keys[:2]]
    for row in heavy:
        row["response"]["usageMetadata"]["promptTokenCount"] = 10_000_000
    rig.finish(entry["name"], heavy)
    real = results(rig, entry["name"])["cost"]["usd"]
    assert real > entry["boundNanoUsd"] / 1e9
    assert rig.run(now + 1).final == 1
    (entry,) = rig.state(root).doc["children"]
    store = rig.store()
    try:
        assert store.get_counter(counter) == entry["charged"] == round(real * 1e9)
    finally:
        store.close()
    rig.run(now + 2)  # charged once
    store = rig.store()
    try:
        assert store.get_counter(counter) == entry["charged"]
    finally:
        store.close()
