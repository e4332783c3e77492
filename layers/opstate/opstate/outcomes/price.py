"""What a batch cost (issue 41): its ledger's token sums priced with pydantic's genai-prices, at
Gemini's Batch API price.

A batch is priced once, when it is archived, from the summary's ``usageBands`` (the ledger's
sums per model and price band, ``ledger.BatchLedger.bands``, with the per-modality sums of
issue 47): one price per band. A tiered price is chosen by one request's prompt size, never by
a sum, so each band is priced as its average row (``Decimal`` counts; every row of a band pays
the same rates, so the average row's price times the band's rows is the band's price exactly).
The average row is rebuilt as a ``usageMetadata`` (the six counts and each
``*TokensDetails`` list by modality) and read by genai-prices' own Google extractor
(``genai_prices.extract_usage``): input = prompt + tool-use prompt, with its audio, image and
video parts; cache read = cached content, by modality; output = candidates + thoughts
(thinking tokens are billed as output), image and audio output apart.

The Batch API price: genai-prices 0.2.5 knows it for some Google models (a price variant
``{"processing": "batch"}``, from its own start date, the standard cache rates kept); for
those its batch price is used (``batch_discount.by``: ``genai-prices``). For any other model
(``by``: ``opstate``) every input and output rate of the standard price (text, audio, image
output, each tier) is multiplied by ``BATCH_FACTOR`` and the cache rates are kept: Google's
batch table keeps the standard context-caching price (``BATCH_CACHE_FACTOR``).

Never a lower figure: a band with tokens of a modality the price has no rate of its own for
(``RATE_OF``: audio input or cache, image, audio or video output; a modality of no known name)
is not priced, with that reason, rather than priced at the text rate. Image, video and
document input are billed at the input rate (Google's tables: "Input price (text / image /
video)").

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
from types import MappingProxyType
from typing import Any

from opstate.domain.costs import BATCH_FACTOR, REASON_NO_USAGE
from opstate.outcomes.ledger_reading import (
    DETAIL_KEYS,
    OTHER_MODEL,
    PRICE_TIER_STARTS,
    USAGE_FIELDS,
)

BATCH_CONTEXT = {"processing": "batch"}
PROVIDER = "google"
# What ``usd`` is shown rounded to (a nano-dollar; a row of the cheapest model costs more).
REASON_NOT_PRICED = "genai-prices is not installed where this batch was archived"
MAX_COUNT = 2**63 - 1  # as summary.MAX_COUNT: a DynamoDB number, an int64
_FIELD = {name: i + 1 for i, name in enumerate(USAGE_FIELDS)}  # offset in a band's sums
# Google's batch price of context caching: the standard one ("Batch" column of
# https://ai.google.dev/gemini-api/docs/pricing: Gemini 2.0 Flash context caching $0.025 / 1M
# both; 2.5 Pro, 2.5 Flash, 2.5 Flash-Lite and 3 Flash alike), as genai-prices' own batch
# variants keep it.
BATCH_CACHE_FACTOR = Decimal(1)
# A genai-prices usage key -> the price key that must be set for it (else not priced: the
# general rate would be a lower figure). Input image/video/document pay the input rate.
RATE_OF = {
    "input_audio_tokens": "input_audio_mtok",
    "cache_audio_read_tokens": "cache_audio_read_mtok",
    "output_image_tokens": "output_image_mtok",
    "output_audio_tokens": "output_audio_mtok",
    "output_video_tokens": "output_video_mtok",
}


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
    # detail list -> modality -> tokens (``bands_of``'s ``modalities``)
    modalities: Mapping[str, Mapping[str, int]] = MappingProxyType({})

    def count(self, name: str) -> int:
        return self.sums[_FIELD[name] - 1]

    def average_usage(self) -> dict[str, Any]:
        """The band's average row as a ``usageMetadata`` (Decimal counts)."""
        rows = Decimal(self.rows)
        meta: dict[str, Any] = {
            k: Decimal(n) / rows for k, n in zip(USAGE_FIELDS, self.sums, strict=True)
        }
        for detail, counts in self.modalities.items():
            meta[detail] = [
                {"modality": m, "tokenCount": Decimal(n) / rows} for m, n in counts.items()
            ]
        return meta


def bands_of(ledger_bands: Mapping[tuple[str | None, int], list[int]]) -> list[dict[str, Any]]:
    """The ledger's ``bands`` as the summary keeps them: ``[{model, band, rows, usage}]``."""
    found = []
    for (model, band), sums in sorted(ledger_bands.items(), key=lambda kv: str(kv[0])):
        item: dict[str, Any] = {
            "model": model,
            "band": band,
            "rows": min(sums[0], MAX_COUNT),
            "usage": {k: min(n, MAX_COUNT) for k, n in zip(USAGE_FIELDS, sums[1:], strict=False)},
        }
        modalities: dict[str, dict[str, int]] = {}
        for (detail, modality), n in zip(DETAIL_KEYS, sums[1 + len(USAGE_FIELDS) :], strict=False):
            if n:
                modalities.setdefault(detail, {})[modality] = min(n, MAX_COUNT)
        if modalities:  # issue 47: absent in a summary of 0.6.0 (its rows priced as text)
            item["modalities"] = modalities
        found.append(item)
    return found


def _bands(raw: object) -> list[Band]:
    bands = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, Mapping):
            continue
        usage = item.get("usage") if isinstance(item.get("usage"), Mapping) else {}
        assert isinstance(usage, Mapping)
        sums = tuple(int(usage.get(name) or 0) for name in USAGE_FIELDS)
        model = item.get("model")
        raw_modalities = item.get("modalities")
        modalities = {
            str(detail): {str(m): int(n) for m, n in counts.items() if n}
            for detail, counts in (
                raw_modalities.items() if isinstance(raw_modalities, Mapping) else ()
            )
            if isinstance(counts, Mapping)
        }
        bands.append(
            Band(
                model=model if isinstance(model, str) else None,
                band=int(item.get("band") or 0),
                rows=int(item.get("rows") or 0),
                sums=sums,
                modalities=modalities,
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
        total, model, by = _price_band(genai_prices, band, ref, when)
        priced.usd += total * band.rows
        priced.models.add(model)
        priced.by.add(by)
    return priced


def _price_band(
    genai_prices: Any, band: Band, ref: str, when: datetime
) -> tuple[Decimal, str, str]:
    """The batch price of ``band``'s average row: (usd, genai-prices' model id, ``by``)."""
    for detail, counts in band.modalities.items():
        if counts.get("OTHER"):
            raise UnpricedError(
                f"{counts['OTHER']} tokens of {detail} are of a modality genai-prices "
                "does not price"
            )
    usage = _usage_of(genai_prices, band.average_usage())
    try:
        calc = genai_prices.calc_price(
            usage, ref, provider_id=PROVIDER, genai_request_timestamp=when
        )
        batch = _has_batch_price(calc.model, when)
        if batch:
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
    _check_rates(calc.model_price, usage, ref)
    if batch:
        return Decimal(calc.total_price), str(calc.model.id), "genai-prices"
    total = _batch_price(calc.model_price).calc_price(usage)["total_price"]
    return Decimal(total), str(calc.model.id), "opstate"


def _usage_of(genai_prices: Any, meta: dict[str, Any]) -> Any:
    """genai-prices' ``Usage`` of a rebuilt ``usageMetadata``, read by its Google extractor
    (a band whose counts are all 0 has none to read: an empty usage, priced 0)."""
    if not any(v for k, v in meta.items() if k in _FIELD):
        return genai_prices.Usage()
    try:
        extracted = genai_prices.extract_usage({"usageMetadata": meta}, provider_id=PROVIDER)
    except ValueError as exc:
        raise UnpricedError(f"genai-prices could not read the usage: {exc}") from exc
    return extracted.usage


def _check_rates(model_price: Any, usage: Any, ref: str) -> None:
    """Tokens of a modality (``RATE_OF``) the price has no rate of its own for: not priced."""
    for usage_key, price_key in RATE_OF.items():
        if usage.reported_value(usage_key) and getattr(model_price, price_key, None) is None:
            what = usage_key.removesuffix("_tokens").replace("_", " ")
            raise UnpricedError(
                f"{prices_version()} has no {what} price of {ref!r}: its tokens are not "
                "priced at another rate"
            )


def _batch_price(model_price: Any) -> Any:
    """The Batch API price opstate derives from a standard one: every per-token rate times
    ``BATCH_FACTOR``, the cache rates times ``BATCH_CACHE_FACTOR`` (see the module docstring)."""
    from genai_prices.types import ModelPrice, Tier, TieredPrices

    def times(value: Any, factor: Decimal) -> Any:
        if isinstance(value, TieredPrices):
            return TieredPrices(
                base=value.base * factor,
                tiers=[Tier(start=t.start, price=t.price * factor) for t in value.tiers],
            )
        return value * factor

    prices = {}
    for key, value in vars(model_price).items():
        if value is None or not key.endswith("_mtok"):
            prices[key] = value
        else:
            factor = BATCH_CACHE_FACTOR if key.startswith("cache_") else BATCH_FACTOR
            prices[key] = times(value, factor)
    return ModelPrice(**prices)


def has_image_output(ref: str, when: datetime) -> bool:
    """Whether genai-prices prices image output of model ``ref`` (at ``when``) at a rate of its
    own (``UnpricedError`` when it does not know the model)."""
    try:
        import genai_prices

        calc = genai_prices.calc_price(
            genai_prices.Usage(), ref, provider_id=PROVIDER, genai_request_timestamp=when
        )
    except ImportError as exc:  # pragma: no cover - every function that acts installs it
        raise UnpricedError(REASON_NOT_PRICED) from exc
    except LookupError as exc:
        raise UnpricedError(f"{prices_version()} does not know the model {ref!r}") from exc
    return getattr(calc.model_price, "output_image_mtok", None) is not None


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
    price's input and output rates times ``factor``, its cache rates kept), ``genai-prices``
    (its own batch price, ``factor`` null) or ``mixed`` (some bands each way)."""
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
