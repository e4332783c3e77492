"""What a batch cost (issue 41): the ledger's bands priced once each with genai-prices, equal to
pricing every row on its own, at the Batch API price; unknown (null, with why) never 0."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import genai_prices
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opstate.domain.costs import (
    BATCH_FACTOR,
    REASON_NO_USAGE,
    REASON_PREVIOUS_RELEASE,
    archive_cost,
    cost_view,
    lineage_cost,
)
from opstate.outcomes.ledger import BatchLedger
from opstate.outcomes.ledger_reading import MAX_BAND_MODELS, OTHER_MODEL, USAGE_FIELDS, band_of
from opstate.outcomes.price import bands_of, cost_of

WHEN = datetime(2026, 12, 1, tzinfo=UTC)
WHEN_NS = int(WHEN.timestamp()) * 10**9


def row(model: str | None, prompt: int, out: int, thoughts: int = 0, cached: int = 0) -> bytes:
    response: dict[str, Any] = {
        "candidates": [{"content": {"parts": [{"text": "x"}]}}],
        "usageMetadata": {
            "promptTokenCount": prompt,
            "candidatesTokenCount": out,
            "thoughtsTokenCount": thoughts,
            "cachedContentTokenCount": cached,
            "totalTokenCount": prompt + out + thoughts,
        },
    }
    if model is not None:
        response["modelVersion"] = model
    return json.dumps({"key": "k", "response": response}).encode() + b"\n"


def row_price(model: str, prompt: int, out: int, thoughts: int, cached: int) -> Decimal:
    """One row priced on its own, the way the Batch API bills it: genai-prices' batch price
    (its ``processing: batch`` price variant) when its data has one for the model, else its
    standard price times BATCH_FACTOR on everything but cache reads, which keep their standard
    rate (issue 47: Google's batch table keeps context caching at the standard price)."""
    usage = genai_prices.Usage(
        input_tokens=prompt, output_tokens=out + thoughts, cache_read_tokens=cached
    )
    standard = genai_prices.calc_price(
        usage, model, provider_id="google", genai_request_timestamp=WHEN
    )
    variants = standard.model.price_variants or []
    if any(v.when == {"processing": "batch"} for v in variants):
        batch = genai_prices.calc_price(
            usage,
            model,
            provider_id="google",
            genai_request_timestamp=WHEN,
            price_context={"processing": "batch"},
        )
        return batch.total_price
    rate = standard.model_price.cache_read_mtok or Decimal(0)
    if isinstance(rate, genai_prices.types.TieredPrices):
        rate = next((t.price for t in reversed(rate.tiers) if prompt > t.start), rate.base)
    cache = rate * cached / 1_000_000
    return (standard.total_price - cache) * BATCH_FACTOR + cache


def summary_of_rows(data: bytes, use_msgspec: bool = True) -> dict[str, Any]:
    ledger = BatchLedger(use_msgspec=use_msgspec)
    ledger.feed(data)
    ledger.finish()
    return {"rows": ledger.rows.as_dict(), "usageBands": bands_of(ledger.bands)}


def test_a_model_without_a_batch_price_in_genai_prices_is_half_its_standard_price() -> None:
    # gemini-2.0-flash: genai-prices 0.2.5 has its standard price only. Half of it on input
    # and output, cache reads at the standard rate (the next test).
    data = row("gemini-2.0-flash", 1000, 200) + row("gemini-2.0-flash", 3000, 50)
    cost = cost_of(summary_of_rows(data), None, WHEN_NS, WHEN_NS)
    usage = genai_prices.Usage(input_tokens=4000, output_tokens=250)
    standard = genai_prices.calc_price(usage, "gemini-2.0-flash", provider_id="google")
    assert Decimal(cost["usd"]) == standard.total_price * Decimal("0.5")
    assert cost["batch_discount"] == {"by": "opstate", "factor": "0.5"}
    assert cost["model"] == "gemini-2.0-flash"
    assert cost["prices"] == f"genai-prices {genai_prices.__version__}"


def test_a_model_with_a_batch_price_in_genai_prices_takes_it() -> None:
    data = row("gemini-2.5-flash", 1000, 200, thoughts=300)
    cost = cost_of(summary_of_rows(data), None, WHEN_NS, WHEN_NS)
    usage = genai_prices.Usage(input_tokens=1000, output_tokens=500)
    batch = genai_prices.calc_price(
        usage,
        "gemini-2.5-flash",
        provider_id="google",
        genai_request_timestamp=WHEN,
        price_context={"processing": "batch"},
    )
    assert Decimal(cost["usd"]) == batch.total_price
    assert cost["batch_discount"] == {"by": "genai-prices", "factor": None}


def test_thinking_tokens_are_billed_as_output() -> None:
    plain = cost_of(summary_of_rows(row("gemini-2.0-flash", 100, 500)), None, WHEN_NS, WHEN_NS)
    thinking = cost_of(
        summary_of_rows(row("gemini-2.0-flash", 100, 200, thoughts=300)), None, WHEN_NS, WHEN_NS
    )
    assert plain["usd"] == thinking["usd"]


def test_rows_either_side_of_a_tier_are_priced_each_at_its_own_rate() -> None:
    """gemini-2.5-pro costs more per token above 200k prompt tokens: the sum of a small and
    a large row priced together would put both in the upper tier."""
    small, large = (1_000, 100), (250_000, 100)
    data = row("gemini-2.5-pro", *small) + row("gemini-2.5-pro", *large)
    summary = summary_of_rows(data)
    assert sorted(b["band"] for b in summary["usageBands"]) == [0, band_of(250_000)]
    cost = cost_of(summary, None, WHEN_NS, WHEN_NS)
    expected = row_price("gemini-2.5-pro", *small, 0, 0) + row_price("gemini-2.5-pro", *large, 0, 0)
    assert Decimal(cost["usd"]) == expected
    together = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=251_000, output_tokens=200),
        "gemini-2.5-pro",
        provider_id="google",
        genai_request_timestamp=WHEN,
        price_context={"processing": "batch"},
    ).total_price
    assert Decimal(cost["usd"]) < together


MODELS = ["gemini-2.0-flash", "gemini-2.5-flash", "gemini-2.5-pro", "gemini-2.5-flash-lite"]
rows_strategy = st.lists(
    st.tuples(
        st.sampled_from(MODELS),
        st.integers(0, 300_000),
        st.integers(0, 5_000),
        st.integers(0, 5_000),
        st.integers(0, 100),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, use_msgspec=st.booleans())
def test_one_price_per_band_is_every_row_priced_on_its_own(
    rows: list[tuple[str, int, int, int, int]], use_msgspec: bool
) -> None:
    data = b"".join(row(m, p, o, t, min(c, p)) for m, p, o, t, c in rows)
    cost = cost_of(summary_of_rows(data, use_msgspec), None, WHEN_NS, WHEN_NS)
    expected = sum((row_price(m, p, o, t, min(c, p)) for m, p, o, t, c in rows), start=Decimal(0))
    # equal but for the rounding of a band's average row (28 significant digits)
    assert abs(Decimal(cost["usd"]) - expected) <= Decimal("1e-18")


def test_the_model_of_the_batch_prices_rows_that_name_none() -> None:
    summary = summary_of_rows(row(None, 1000, 200))
    assert cost_of(summary, None, WHEN_NS, WHEN_NS)["usd"] is None
    priced = cost_of(summary, "models/gemini-2.0-flash", WHEN_NS, WHEN_NS)
    assert Decimal(priced["usd"]) == row_price("gemini-2.0-flash", 1000, 200, 0, 0)


def test_an_unknown_model_or_no_usage_is_unknown_with_why_never_zero() -> None:
    unknown = cost_of(summary_of_rows(row("gemini-99-ultra", 10, 10)), None, WHEN_NS, WHEN_NS)
    assert (
        unknown["usd"] is None and "does not know the model 'gemini-99-ultra'" in unknown["reason"]
    )
    empty = cost_of(summary_of_rows(b'{"key": "k", "status": {"code": 429}}\n'), None, 1, 1)
    assert empty["usd"] is None and empty["reason"] == REASON_NO_USAGE
    shown = cost_view(unknown)
    assert shown["usd"] is None and shown["reason"] == unknown["reason"]


def test_more_models_than_the_ledger_keeps_apart_are_unknown() -> None:
    data = b"".join(row(f"gemini-x-{i}", 10, 10) for i in range(MAX_BAND_MODELS + 2))
    summary = summary_of_rows(data)
    assert OTHER_MODEL in {b["model"] for b in summary["usageBands"]}
    assert len({b["model"] for b in summary["usageBands"]}) == MAX_BAND_MODELS + 1
    assert cost_of(summary, None, 1, 1)["usd"] is None


def test_an_archive_of_the_previous_release_shows_an_unknown_cost() -> None:
    archive = {"status": "archived", "summary": {"rows": {"total": 1}, "usage": {}}}
    assert archive_cost(archive)["usd"] is None
    assert archive_cost(archive)["reason"] == REASON_PREVIOUS_RELEASE


def test_a_lineage_costs_the_sum_of_its_batches_and_says_what_retries_added() -> None:
    def archived(usd: str | None) -> dict[str, Any]:
        cost = {
            "usd": usd,
            "model": "gemini-2.0-flash",
            "prices": "genai-prices 0.2.5",
            "batch_discount": {"by": "opstate", "factor": "0.5"},
        }
        if usd is None:
            cost["reason"] = "no row reports its token usage"
        return {"status": "archived", "summary": {"rows": {}, "cost": cost}}

    archives = {"r": archived("0.25"), "c1": archived("0.0125"), "c2": {"status": "none"}}
    cost = lineage_cost(["r", "c1", "c2"], archives)
    assert Decimal(cost["usd"]) == Decimal("0.2625")
    assert Decimal(cost["retries_usd"]) == Decimal("0.0125")
    archives["c1"] = archived(None)
    unknown = lineage_cost(["r", "c1", "c2"], archives)
    assert unknown["usd"] is None and "c1" in unknown["reason"]


def test_genai_prices_is_imported_only_when_a_price_is_computed() -> None:
    code = (
        "import sys; import opstate.outcomes.run, opstate.outcomes.price, opstate.domain.costs,"
        " opstate.outcomes.plan; print('genai_prices' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("prompt", [0, 100_000, 100_001, 128_000, 128_001, 200_000, 200_001])
def test_a_band_is_how_many_tier_starts_the_prompt_is_over(prompt: int) -> None:
    assert band_of(prompt) == sum(prompt > s for s in (100_000, 128_000, 200_000))


band_rows = st.lists(
    st.tuples(
        st.sampled_from(["gemini-2.0-flash", "gemini-2.5-pro", None, 7, "x" * 200]),
        st.integers(0, 300_000),
        st.integers(0, 50),
        st.booleans(),  # with usageMetadata
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(rows=band_rows, cut=st.integers(1, 4000))
def test_both_ledger_ways_band_alike_and_the_bands_add_up_to_the_usage(
    rows: list[tuple[object, int, int, bool]], cut: int
) -> None:
    lines = []
    for model, prompt, out, has_usage in rows:
        response: dict[str, Any] = {"candidates": [{"finishReason": "STOP"}]}
        if model is not None:
            response["modelVersion"] = model
        if has_usage:
            response["usageMetadata"] = {"promptTokenCount": prompt, "candidatesTokenCount": out}
        lines.append(json.dumps({"key": "k", "response": response}).encode())
    data = b"\n".join(lines) + b"\n"
    found = []
    for use_msgspec in (True, False):
        ledger = BatchLedger(use_msgspec=use_msgspec)
        for i in range(0, len(data), cut):
            ledger.feed(data[i : i + cut])
        ledger.finish()
        bands = ledger.bands
        assert sum(b[0] for b in bands.values()) == sum(1 for r in rows if r[3])
        for i, name in enumerate(USAGE_FIELDS, 1):
            assert sum(b[i] for b in bands.values()) == ledger.usage[name]
        found.append(bands)
    assert found[0] == found[1]
