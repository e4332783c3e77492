"""What retries may spend (issue 41; docs/retry.md, "What retries may spend"): a lineage's
``maxCostUSD`` and the deployment's ``OPSTATE_RETRY_DAILY_BUDGET_USD``.

Checked once per attempt, when its children are planned and before any is created
(``check``): the lineage's cost so far (every batch of it, priced when archived:
``domain.costs.lineage_cost``) plus the planned children's bound (issue 47: each child's own
input rows read from the sink by ``outcomes.estimate.estimate_rows``: their bytes as input
tokens, their ``maxOutputTokens`` or the model's output limit as output, at the model's batch
price, image output at the image rate) against ``maxCostUSD``; then that bound is reserved in
the day's counter (``store.counters``: one atomic add under the cap, so lineages passing at
once never go over it together). Over either, nothing is created: the planned
children are ``refused``, the lineage ``stopped`` (its final result follows, with the failures
kept), said once at error level and counted in ``RetryStopped`` (alarmed) and
``RetryBudgetStopped``.

A cap with an unknown cost creates nothing either (a batch priced by no model genai-prices
knows, an archive of an earlier release, a row whose bytes do not bound its tokens): what it
would spend cannot be bounded, and the stop says why. Each child reserved for records its
bound (``boundNanoUsd``) and the counter (``reservedIn``); once it is archived and priced,
``charge`` adds what it really cost beyond its bound to that day's counter (issue 47; a cost
below the bound is not given back, an unknown one adds nothing: the bound stands). A crash
between the reservation and the plan's write reserves again at the next pass, and a charge
whose write loses a race is added again by the winner (over-counted, never under).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from typing import Any

from opstate.domain.costs import decimal_of, lineage_cost, stored_usd
from opstate.domain.model import OpRecord
from opstate.domain.retry import policy_of
from opstate.domain.times import format_time
from opstate.observability import count
from opstate.outcomes.estimate import estimate_rows
from opstate.retry import lineage
from opstate.retry.passes import Runner, said_stopped
from opstate.store.counters import CountingStore
from opstate.store.port import ArchiveState
from opstate.store.retry_state import RetryState

NANO = Decimal(1_000_000_000)
UNCAPPED = 2**62  # a charge of what was spent is added whatever the cap
DAILY_COUNTER = "retry-spend-nano-usd:{day}"
REFUSED_ERROR = "over the retry budget"
STOP_PREFIX = "the retry budget stopped it"


@dataclass(frozen=True)
class Estimate:
    """The lineage's cost so far and the planned children's estimate (None: unknown, ``why``)."""

    so_far: Decimal | None
    coming: Decimal | None
    rows: int
    why: str | None


def planned_bound(runner: Runner, planned: list[dict[str, Any]]) -> tuple[Decimal | None, str]:
    """At most what the ``planned`` children cost (``estimate_rows`` of each one's input in
    the sink, on its model), or (None, why not)."""
    when = datetime.fromtimestamp(runner.clock_ns() / 1e9, tz=UTC)
    total = Decimal(0)
    for entry in planned:
        bound = estimate_rows(
            runner.sink.chunks(str(entry["input"])),
            entry.get("model"),
            when=when,
            max_line_bytes=runner.config.max_line_bytes,
        )
        if bound.usd is None:
            return None, f"a retry batch's rows cannot be bounded ({bound.reason})"
        entry["boundNanoUsd"] = _nano(bound.usd)
        total += bound.usd
    return total, ""


def estimate(
    runner: Runner,
    refs: list[lineage.MemberRef],
    archives: Mapping[str, ArchiveState | None],
    planned: list[dict[str, Any]],
) -> Estimate:
    rows = sum(int(e.get("rows") or 0) for e in planned)
    names = [ref.name for ref in refs]
    cost = lineage_cost(names, {n: (a.as_dict() if a else None) for n, a in archives.items()})
    so_far = decimal_of(cost)
    if so_far is None:
        return Estimate(None, None, rows, str(cost.get("reason")))
    coming, why = planned_bound(runner, planned)
    return Estimate(so_far, coming, rows, why or None)


def _usd(value: Decimal) -> str:
    return f"${value.quantize(Decimal('0.000001'), rounding=ROUND_CEILING)}"


def over_cap(cap: float | None, est: Estimate) -> str | None:
    """Why ``maxCostUSD`` stops the planned children (None: it does not)."""
    if cap is None:
        return None
    if est.so_far is None or est.coming is None:
        return f"{STOP_PREFIX} (maxCostUSD {cap:g}): {est.why}, so it cannot be bounded"
    if est.so_far + est.coming > Decimal(str(cap)):
        return (
            f"{STOP_PREFIX}: the lineage cost {_usd(est.so_far)} so far and {est.rows} more "
            f"rows may cost up to {_usd(est.coming)}, over its maxCostUSD ${cap:g}"
        )
    return None


def _nano(usd: Decimal) -> int:
    return int((usd * NANO).to_integral_value(rounding=ROUND_CEILING))


def charge(
    runner: Runner, root: OpRecord, state: RetryState, archives: Mapping[str, ArchiveState | None]
) -> RetryState:
    """Add each archived child's real cost beyond its bound to the day's counter it reserved
    in (once: ``charged`` records what it cost, null when unknown); the state written when a
    child was charged."""
    doc = lineage.mutable(state.doc)
    store, changed = runner.store, False
    for entry in lineage.children(doc):
        counter, bound = entry.get("reservedIn"), entry.get("boundNanoUsd")
        archive = archives.get(str(entry.get("name")))
        if not counter or "charged" in entry or archive is None:
            continue
        if archive.status not in ("archived", "none") or not isinstance(store, CountingStore):
            continue
        usd, _why = stored_usd(archive.as_dict())
        real = None if usd is None else _nano(usd)
        if real is not None and real > int(bound or 0):
            store.add_counter(str(counter), real - int(bound or 0), UNCAPPED)
        entry["charged"] = real
        changed = True
    return runner.write(root, state, doc) if changed else state


def over_daily(
    runner: Runner, daily: float | None, est: Estimate, planned: list[dict[str, Any]]
) -> str | None:
    """Reserve the planned children's estimate in today's counter; why it cannot be (None:
    reserved, or no daily cap)."""
    if daily is None:
        return None
    what = f"{STOP_PREFIX} (OPSTATE_RETRY_DAILY_BUDGET_USD {daily:g})"
    if est.coming is None:
        return f"{what}: {est.why}, so it cannot be bounded"
    store = runner.store
    if not isinstance(store, CountingStore):
        return f"{what}: this store keeps no counters"
    day = format_time(runner.clock_ns())[:10]
    counter = DAILY_COUNTER.format(day=day)
    amount = sum(int(e.get("boundNanoUsd") or 0) for e in planned) or _nano(est.coming)
    cap = math.floor(daily * 1_000_000_000)
    if store.add_counter(counter, amount, cap):
        for entry in planned:
            entry["reservedIn"] = counter
        return None
    spent = Decimal(store.get_counter(counter)) / NANO
    return (
        f"{what}: {est.rows} more rows may cost up to {_usd(est.coming)}, and the retries "
        f"of {day} (UTC) have reserved {_usd(spent)} of ${daily:g}"
    )


def check(
    runner: Runner,
    root: OpRecord,
    doc: dict[str, Any],
    refs: list[lineage.MemberRef],
    archives: Mapping[str, ArchiveState | None],
    planned: list[dict[str, Any]],
) -> bool:
    """Whether the children just ``planned`` (entries of ``doc``, a mutable copy) may be
    created; when not, they are refused and ``doc`` says the budget stopped the lineage (the
    caller writes it, then ``said``)."""
    cap = policy_of(doc).max_cost_usd
    daily = getattr(runner.config, "daily_budget_usd", None)
    if cap is None and daily is None:
        return True
    est = estimate(runner, refs, archives, planned)
    why = over_cap(cap, est) or over_daily(runner, daily, est, planned)
    if why is None:
        return True
    for entry in planned:
        entry.update(phase=lineage.REFUSED, error=REFUSED_ERROR, claimUntilNs=0)
    doc["stopped"] = why
    return False


def said(runner: Runner, root: OpRecord, why: str) -> None:
    """A budget's stop, once written: ``RetryStopped`` and ``RetryBudgetStopped``."""
    said_stopped(runner, root, why)
    count("RetryBudgetStopped")
