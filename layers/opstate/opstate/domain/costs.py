"""How a cost is shown and added up (issue 41): the stored ``cost`` of an archive
(``opstate.outcomes.price``) as ``opstate results --json``, the events and the page show it,
and a lineage's sum. Pure and light (stdlib only): the API and the CLI import it; genai-prices
is never imported here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

# Gemini's Batch API price is half the standard price: "Batch Mode ... at 50% of the standard
# cost" (https://ai.google.dev/gemini-api/docs/batch-mode, and the "Batch" column of
# https://ai.google.dev/gemini-api/docs/pricing). Applied by opstate to a model whose batch
# price genai-prices does not know.
BATCH_FACTOR = Decimal("0.5")
# What ``usd`` is shown rounded to (a nano-dollar; a row of the cheapest model costs more).
SHOWN_QUANTUM = Decimal("0.000000001")
REASON_PREVIOUS_RELEASE = "archived by an earlier release, which did not price results"
REASON_NO_USAGE = "no row reports its token usage"
REASON_NOT_BATCH = "only a batch's output rows are priced"
REASON_NOT_ARCHIVED = "its results are not archived"
REASON_FINAL_PREVIOUS_RELEASE = "written by an earlier release, which did not price results"


def decimal_of(cost: Mapping[str, Any] | None) -> Decimal | None:
    """A stored cost's ``usd`` as a Decimal (None: unknown)."""
    raw = cost.get("usd") if isinstance(cost, Mapping) else None
    if isinstance(raw, bool) or raw is None:
        return None
    try:
        value = Decimal(str(raw))
    except InvalidOperation:
        return None
    return value if value.is_finite() and value >= 0 else None


def shown_usd(value: Decimal) -> float:
    """``usd`` as shown (a JSON number, to a nano-dollar)."""
    return float(value.quantize(SHOWN_QUANTUM))


def cost_view(cost: object) -> dict[str, Any]:
    """The ``cost`` of ``opstate results --json``, an event or the page: ``{usd, model,
    priced_at, prices, batch_discount}`` and ``reason`` when ``usd`` is null. An archive of an
    earlier release carries none: unknown, with that reason."""
    if not isinstance(cost, Mapping):
        return _unknown(REASON_PREVIOUS_RELEASE)
    usd = decimal_of(cost)
    view = {
        "usd": None if usd is None else shown_usd(usd),
        "model": cost.get("model"),
        "priced_at": cost.get("priced_at"),
        "prices": cost.get("prices"),
        "batch_discount": cost.get("batch_discount"),
    }
    if usd is None:
        view["reason"] = cost.get("reason") or REASON_NO_USAGE
    return view


def _unknown(reason: str) -> dict[str, Any]:
    return {
        "usd": None,
        "model": None,
        "priced_at": None,
        "prices": None,
        "batch_discount": None,
        "reason": reason,
    }


def archive_cost(archive: Mapping[str, Any]) -> dict[str, Any]:
    """The shown cost of an archive state (``ArchiveState.as_dict``): its summary's ``cost``;
    unknown, with why, when it has none (not archived, not a batch, an earlier release's)."""
    summary = archive.get("summary")
    summary = summary if isinstance(summary, Mapping) else {}
    if "cost" in summary:
        return cost_view(summary["cost"])
    if archive.get("status") != "archived":
        return _unknown(REASON_NOT_ARCHIVED)
    if summary.get("rows") is None:
        return _unknown(REASON_NOT_BATCH)
    return _unknown(REASON_PREVIOUS_RELEASE)


def stored_usd(archive: Mapping[str, Any] | None) -> tuple[Decimal | None, str | None]:
    """What one batch of a lineage cost: (usd, None), or (None, why it is unknown). A batch
    that left nothing to archive (``none``: it ended without an output) cost nothing."""
    if archive is None:
        return None, REASON_NOT_ARCHIVED
    if archive.get("status") == "none":
        return Decimal(0), None
    shown = archive_cost(archive)
    summary = archive.get("summary")
    stored = summary.get("cost") if isinstance(summary, Mapping) else None
    usd = decimal_of(stored) if isinstance(stored, Mapping) else None
    return (usd, None) if usd is not None else (None, str(shown.get("reason")))


class _Sum:
    """Costs added up for a final result (a lineage's batches, a job's parts): the dollars,
    what retries added, and the models, price tables and batch discounts of what was priced;
    the first unknown cost's reason makes the whole unknown."""

    def __init__(self) -> None:
        self.total = self.retries = Decimal(0)
        self.models: set[str] = set()
        self.prices: set[str] = set()
        self.ways: set[str] = set()
        self.reason: str | None = None

    def unknown(self, reason: str) -> None:
        self.reason = self.reason or reason

    def add(self, usd: Decimal, retries: Decimal, cost: object) -> None:
        self.total += usd
        self.retries += retries
        if not isinstance(cost, Mapping):
            return
        self.models.update(m for m in str(cost.get("model") or "").split(", ") if m)
        if isinstance(cost.get("prices"), str):
            self.prices.add(cost["prices"])
        discount = cost.get("batch_discount")
        if isinstance(discount, Mapping) and isinstance(discount.get("by"), str):
            self.ways.add(discount["by"])

    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "usd": None if self.reason else format(self.total, "f"),
            "retries_usd": None if self.reason else format(self.retries, "f"),
            "model": ", ".join(sorted(self.models)) or None,
            "prices": ", ".join(sorted(self.prices)) or None,
            "batch_discount": _ways(self.ways),
        }
        if self.reason:
            doc["reason"] = self.reason[:300]
        return doc


def lineage_cost(
    names: list[str], archives: Mapping[str, Mapping[str, Any] | None]
) -> dict[str, Any]:
    """The stored cost of a lineage's final result: ``usd`` (every batch: the root's
    ``names[0]`` and its retries), ``retries_usd`` (what the retries added), ``models``,
    ``prices``, ``batch_discount`` (of the batches priced); null with ``reason`` (naming the
    batch) when any batch's cost is unknown."""
    added = _Sum()
    for index, name in enumerate(names):
        archive = archives.get(name)
        usd, why = stored_usd(archive)
        if usd is None:
            added.unknown(f"the cost of {name} is unknown: {why}")
            continue
        summary = archive.get("summary") if archive is not None else None
        cost = summary.get("cost") if isinstance(summary, Mapping) else None
        added.add(usd, usd if index else Decimal(0), cost)
    return added.doc()


def job_cost(parts: list[tuple[str, Mapping[str, Any] | None]]) -> dict[str, Any]:
    """The stored cost of a job's final result (issue 46): the sum of its parts' lineage costs
    (``lineage_cost`` of each part, as its final stored it; a part never created cost
    nothing, so it is not listed); null with ``reason`` (naming the part) when any part's cost
    is unknown - never a lower figure."""
    added = _Sum()
    for name, cost in parts:
        usd = decimal_of(cost) if isinstance(cost, Mapping) else None
        if cost is None or usd is None:
            why = cost.get("reason") if isinstance(cost, Mapping) else None
            added.unknown(f"the cost of part {name} is unknown: {why or 'no final cost'}")
            continue
        retries = decimal_of({"usd": cost.get("retries_usd")}) or Decimal(0)
        added.add(usd, retries, cost)
    return added.doc()


def _ways(ways: Iterable[str]) -> dict[str, Any] | None:
    found = set(ways)
    if not found:
        return None
    by = found.pop() if len(found) == 1 else "mixed"
    return {"by": by, "factor": None if by == "genai-prices" else str(BATCH_FACTOR)}


def final_cost_view(cost: object) -> dict[str, Any]:
    """A final result's ``cost`` as shown: ``{usd, retries_usd, model, prices,
    batch_discount}`` (numbers), and ``reason`` when ``usd`` is null (a final result an
    earlier release wrote carries none: unknown)."""
    if not isinstance(cost, Mapping):
        view = _unknown(REASON_FINAL_PREVIOUS_RELEASE)
    else:
        view = dict(cost_view(cost))
        if view["usd"] is None:
            view["reason"] = cost.get("reason") or view.get("reason")
    view.pop("priced_at", None)
    retries = decimal_of({"usd": cost.get("retries_usd")}) if isinstance(cost, Mapping) else None
    view["retries_usd"] = None if retries is None else shown_usd(retries)
    return view
