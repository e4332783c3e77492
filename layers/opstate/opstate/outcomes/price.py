"""What a batch cost (issue 41): its ledger's token sums priced with pydantic's genai-prices, at
Gemini's Batch API price.

A batch is priced once, when it is archived, from the summary's ``usageBands`` (the ledger's
sums per model and price band, ``ledger.BatchLedger.bands``): one ``calc_price`` per band. A
tiered price is chosen by one request's prompt size, never by a sum, so each band is priced as
its average row (``Usage`` takes ``Decimal`` counts; every row of a band pays the same rates, so
the average row's price times the band's rows is the band's price exactly). The token counts go
to genai-prices as its own Google extractor maps a ``usageMetadata``: input = prompt + tool-use
prompt, cache read = cached content, output = candidates + thoughts (thinking tokens are billed
as output).

The Batch API price: genai-prices 0.2.5 knows it for some Google models only (a price variant
``{"processing": "batch"}``, from its own start date); for those its batch price is used
(``batch_discount.by``: ``genai-prices``), for any other model the standard price times
``BATCH_FACTOR`` (``by``: ``opstate``). Modality-specific rates (audio input) are not applied:
the ledger does not count tokens per modality, so every token is priced as text.

The cost stored beside the summary (``cost``): ``{usd, model, priced_at, prices,
batch_discount}``, ``usd`` the exact decimal as text, or null with ``reason`` (a model
genai-prices does not know, no usage, ...): an unknown cost is never 0. ``cost_view`` shows
it (``usd`` as a number). genai-prices is imported only here, and only when a price is
computed (it takes ~0.2-0.45 s to import): never by the webhook, the API or a view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

from opstate.domain.costs import BATCH_FACTOR, REASON_NO_USAGE
from opstate.outcomes.ledger_reading import OTHER_MODEL, PRICE_TIER_STARTS, USAGE_FIELDS

BATCH_CONTEXT = {"processing": "batch"}
PROVIDER = "google"
# What ``usd`` is shown rounded to (a nano-dollar; a row of the cheapest model costs more).
REASON_NOT_PRICED = "genai-prices is not installed where this batch was archived"
MAX_COUNT = 2**63 - 1  # as summary.MAX_COUNT: a DynamoDB number, an int64
_FIELD = {name: i + 1 for i, name in enumerate(USAGE_FIELDS)}  # offset in a band's sums


class UnpricedError(Exception):
    """A cost that cannot be known; the message says why (``reason``)."""


def prices_version() -> str | None:
    """``genai-prices X.Y.Z`` as installed, or None (read from its metadata: no import)."""
    try:
        return f"genai-prices {package_version('genai-prices')}"
    except PackageNotFoundError:
        return None


def model_ref(model: object) -> str | None:
    """A model name as genai-prices matches it (``models/`` dropped), or None."""
    if not isinstance(model, str) or not model.strip():
        return None
    return model.strip().removeprefix("models/")


@dataclass(frozen=True, slots=True)
class Band:
    """A band of the summary's ``usageBands``: its model, band number, rows and sums."""

    model: str | None
    band: int
    rows: int
    sums: tuple[int, ...]  # USAGE_FIELDS order

    def count(self, name: str) -> int:
        return self.sums[_FIELD[name] - 1]


def bands_of(ledger_bands: Mapping[tuple[str | None, int], list[int]]) -> list[dict[str, Any]]:
    """The ledger's ``bands`` as the summary keeps them: ``[{model, band, rows, usage}]``."""
    return [
        {
            "model": model,
            "band": band,
            "rows": min(sums[0], MAX_COUNT),
            "usage": {k: min(n, MAX_COUNT) for k, n in zip(USAGE_FIELDS, sums[1:], strict=True)},
        }
        for (model, band), sums in sorted(ledger_bands.items(), key=lambda kv: str(kv[0]))
    ]


def _bands(raw: object) -> list[Band]:
    bands = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, Mapping):
            continue
        usage = item.get("usage") if isinstance(item.get("usage"), Mapping) else {}
        assert isinstance(usage, Mapping)
        sums = tuple(int(usage.get(name) or 0) for name in USAGE_FIELDS)
        model = item.get("model")
        bands.append(
            Band(
                model=model if isinstance(model, str) else None,
                band=int(item.get("band") or 0),
                rows=int(item.get("rows") or 0),
                sums=sums,
            )
        )
    return [b for b in bands if b.rows > 0]


@dataclass
class Priced:
    usd: Decimal
    models: set[str]
    by: set[str]


def price_bands(bands: list[Band], fallback_model: str | None, when: datetime) -> Priced:
    """The batch price of ``bands`` (``UnpricedError`` when it cannot be known)."""
    if not bands:
        raise UnpricedError(REASON_NO_USAGE)
    if fallback_model is None and any(b.model is None for b in bands):
        raise UnpricedError("no model named: the rows carry no modelVersion")
    try:
        import genai_prices
    except ImportError as exc:  # pragma: no cover - every function that archives installs it
        raise UnpricedError(REASON_NOT_PRICED) from exc
    priced = Priced(Decimal(0), set(), set())
    for band in bands:
        if band.model == OTHER_MODEL:
            raise UnpricedError("the rows name more models than the ledger keeps apart")
        ref = model_ref(band.model) or model_ref(fallback_model)
        if ref is None:
            raise UnpricedError("no model named: the rows carry no modelVersion")
        rows = Decimal(band.rows)
        usage = genai_prices.Usage(
            input_tokens=(band.count("promptTokenCount") + band.count("toolUsePromptTokenCount"))
            / rows,
            cache_read_tokens=band.count("cachedContentTokenCount") / rows,
            output_tokens=(band.count("candidatesTokenCount") + band.count("thoughtsTokenCount"))
            / rows,
        )
        try:
            calc = genai_prices.calc_price(
                usage,
                ref,
                provider_id=PROVIDER,
                genai_request_timestamp=when,
                price_context=BATCH_CONTEXT,
            )
        except LookupError as exc:
            raise UnpricedError(f"{prices_version()} does not know the model {ref!r}") from exc
        except ValueError as exc:  # usage it refuses (cached above the prompt)
            raise UnpricedError(f"genai-prices refused the usage of {ref!r}: {exc}") from exc
        _check_tiers(calc.model_price, ref)
        total = calc.total_price * rows
        if _has_batch_price(calc.model, when):
            priced.by.add("genai-prices")
        else:
            total *= BATCH_FACTOR
            priced.by.add("opstate")
        priced.usd += total
        priced.models.add(str(calc.model.id))
    return priced


def _check_tiers(model_price: Any, ref: str) -> None:
    """A tiered price of the model must start at one of ``PRICE_TIER_STARTS`` (the ledger's
    band edges), else a band could hold rows of two tiers: not priced."""
    from genai_prices.types import TieredPrices

    for value in vars(model_price).values():
        if isinstance(value, TieredPrices):
            for tier in value.tiers:
                if tier.start not in PRICE_TIER_STARTS:
                    raise UnpricedError(
                        f"the price of {ref!r} changes at {tier.start} prompt tokens, "
                        "which the ledger's bands do not separate"
                    )


def _has_batch_price(model: Any, when: datetime) -> bool:
    """Whether genai-prices has a Batch API price of ``model`` in force at ``when``."""
    for variant in getattr(model, "price_variants", None) or ():
        if dict(variant.when) != BATCH_CONTEXT:
            continue
        if variant.constraint is None or variant.constraint.active(when):
            return True
    return False


def discount_of(by: Iterable[str]) -> dict[str, Any]:
    """``batch_discount``: how the Batch API price was had. ``by``: ``opstate`` (the standard
    price times ``factor``), ``genai-prices`` (its own batch price, ``factor`` null) or
    ``mixed`` (some bands each way)."""
    ways = set(by)
    shown = ways.pop() if len(ways) == 1 else "mixed" if ways else "opstate"
    return {"by": shown, "factor": None if shown == "genai-prices" else str(BATCH_FACTOR)}


def cost_of(
    summary: Mapping[str, Any], fallback_model: str | None, when_ns: int, now_ns: int
) -> dict[str, Any]:
    """The stored ``cost`` of an archive summary (see the module docstring); ``when_ns``: when
    the batch ran (its prices then), ``now_ns``: ``priced_at``."""
    from opstate.domain.times import format_time

    cost: dict[str, Any] = {
        "usd": None,
        "model": None,
        "priced_at": format_time(now_ns),
        "prices": prices_version(),
        "batch_discount": None,
    }
    when = datetime.fromtimestamp(when_ns / 1e9, tz=UTC) if when_ns > 0 else None
    try:
        priced = price_bands(
            _bands(summary.get("usageBands")),
            fallback_model,
            when or datetime.fromtimestamp(now_ns / 1e9, tz=UTC),
        )
    except UnpricedError as exc:
        cost["reason"] = str(exc)[:300]
        return cost
    cost.update(
        usd=format(priced.usd, "f"),
        model=", ".join(sorted(priced.models)),
        batch_discount=discount_of(priced.by),
    )
    return cost
