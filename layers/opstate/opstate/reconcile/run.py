"""One reconcile run: webhook health, discovery, then the due operations, oldest due first.

See docs/reconciler.md for the story; the parameters are documented on ``reconcile_once``.
The phases live beside it: ``discovery`` (webhook health, discovery), ``polling`` (the due
entries), ``lanes`` (one per backend) and ``runner`` (what the phases share).

Polling, per due entry of the open index (``PollingStore.iter_due(now)``, paged lazily, so a
run goes as far as its budget allows and the next run continues with what is still due):

1. wait for a token of the shared rate limit and for any shared backoff pause; stop starting
   work when the budget, the breaker or ``max_polls`` says so;
2. ``gateway.fetch(record)``; an answer is first reduced against the listed record (pure): if
   even that drops it, the store is not touched (an unchanged answer costs no read); otherwise
   it goes through ``ingest``;
3. a terminal record is done (it left the index); an open one gets its next ``PollState``
   from the ``Schedule`` (``set_poll``, conditional on the version), with the lost / overdue
   marks it reached, each written on its own so the table's stream announces each once, and
   a batch's progress (``batch_stats``) beside it.

A 404 never changes the record: it counts towards ``lost``. A transient failure (408, 429,
5xx, timeout) leaves the entry due, feeds the shared backoff (``Retry-After`` honoured) and
the breaker. Everything that happens is reported to ``on_decision``.

Two backends, one run: Gemini API records go to ``gateway``, Google Cloud records
(``projects/...``, ``names.backend_of``) to ``cloud``. Each backend has its own lane: its rate
limit (``reconcile_max_rps`` / ``google_cloud_max_rps``), backoff and breaker. Discovery lists
the Gemini API's batches, then each Cloud scope's jobs, ``reconcile_max_pages`` pages each.
When a lane's credentials are missing or refused (``AuthError``) the lane stops: one error
line and one ``GoogleCloudAuthFailed`` metric per run, its entries stay due, the other lane
goes on. A Cloud record with no Cloud configuration is such a refusal too (no request made).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from opstate.config import Settings, parse_overdue
from opstate.domain.model import Decision, OpRecord
from opstate.reconcile.discovery import Pace, Settled, check_webhooks, discover
from opstate.reconcile.gateway import CloudGateway, Gateway
from opstate.reconcile.pacing import DEFAULT_BACKOFF, SYSTEM_CLOCK, Backoff, Budget, Clock
from opstate.reconcile.polling import Polled, poll_due, poll_record
from opstate.reconcile.runner import Run
from opstate.reconcile.schedule import Schedule
from opstate.reconcile.tally import (
    DecisionHook,
    MarkDecision,
    RunDecision,
    RunResult,
)
from opstate.store.port import PollingStore


def schedule_from_settings(settings: Settings) -> Schedule:
    return Schedule(
        max_interval_s=settings.reconcile_max_interval_s,
        polled_only_max_interval_s=settings.reconcile_polled_only_max_interval_s,
        lost_after_misses=settings.reconcile_lost_after_runs,
        lost_after_s=settings.reconcile_lost_after_s,
        overdue_after_s=parse_overdue(settings.reconcile_overdue_hours),
        run_every_s=settings.reconcile_rate_s,
    )


def reconcile_once(
    store: PollingStore,
    gateway: Gateway,
    *,
    settings: Settings,
    remaining_ms: Callable[[], int] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    schedule: Schedule | None = None,
    backoff: Backoff = DEFAULT_BACKOFF,
    on_decision: DecisionHook | None = None,
    cloud: CloudGateway | None = None,
    discovery: Pace | None = None,
    settled: Settled | None = None,
) -> RunResult:
    """One reconcile run (see the module docstring).

    - ``discovery``: when the Gemini API's batches are listed (``discovery.Pace``); None:
      every run.
    - ``settled``: the final records earlier runs' listings found (``discovery.Settled``,
      kept by the process across runs): a listed job that drops against one is not read.

    - ``cloud``: the Google Cloud gateway; None (no Cloud configuration): Cloud records are
      never requested (reported as refused, once per run) and no Cloud scope is listed.

    - ``remaining_ms``: milliseconds left (``context.get_remaining_time_in_millis``); None
      means no budget. No request starts once less than ``reconcile_safety_margin_s`` (plus
      any pause it would first have to wait) is left.
    - ``clock``: wall time for schedules and records, monotonic time and sleep for pacing.
    - ``schedule``: defaults to the one ``settings`` describes.
    - ``on_decision``: called with every ingest ``Decision`` (discovered jobs, polled answers,
      also those dropped without touching the store) and every ``MarkDecision`` (lost,
      overdue), from worker threads; an exception in it is logged and ignored.

    At most ``reconcile_open_limit`` operations are polled per run. A store fault while
    reading the open index escapes (the run as a whole failed); everything per operation is
    counted instead.
    """
    run = Run(
        store,
        gateway,
        settings,
        schedule if schedule is not None else schedule_from_settings(settings),
        Budget(remaining_ms, settings.reconcile_safety_margin_s),
        clock,
        backoff,
        on_decision,
        settings.reconcile_open_limit,
        cloud,
    )
    with ThreadPoolExecutor(
        max_workers=max(1, settings.reconcile_workers), thread_name_prefix="reconcile"
    ) as pool:
        check_webhooks(run)
        discovered = discover(run, pool, discovery, settled)
        poll_due(run, pool, discovered)
    return run.emit()


@dataclass(frozen=True, slots=True)
class Refreshed:
    """What ``refresh_one`` did: the record before, the decision on Gemini's answer (None when
    there was none), ``found`` (False: Gemini answered 404) and the error as a sentence."""

    record: OpRecord
    decision: Decision | None
    found: bool
    error: str | None

    def sentence(self) -> str:
        """One line for a person: the decision (as ``opstate report`` prints one), the 404,
        or why there was no answer."""
        record = self.record
        stays = f"stays {record.state} (version {record.version})"
        if self.error is not None:
            return f"{record.name}: not refreshed, {stays}: {self.error}"
        if not self.found:
            return f"{record.name}: Gemini answered 404 (not found); the record is kept, {stays}"
        decision = self.decision
        if decision is None:
            return f"{record.name}: Gemini's answer was not an event this version reads; {stays}"
        now = decision.record if decision.record is not None else record
        if decision.applied:
            return f"{record.name}: {decision.reason}, now {now.state} (version {now.version})"
        return (
            f"{record.name}: dropped ({decision.reason}), stays {now.state} (version {now.version})"
        )

    def as_dict(self) -> dict[str, object]:
        decision = self.decision
        now = decision.record if decision is not None and decision.record else self.record
        return {
            "name": self.record.name,
            "found": self.found,
            "applied": decision.applied if decision is not None else False,
            "reason": str(decision.reason) if decision is not None else None,
            "state": str(now.state),
            "version": now.version,
            "error": self.error,
        }


def refresh_one(
    store: PollingStore,
    gateway: Gateway,
    record: OpRecord,
    *,
    settings: Settings,
    clock: Clock = SYSTEM_CLOCK,
    on_decision: DecisionHook | None = None,
    cloud: CloudGateway | None = None,
) -> Refreshed:
    """Poll ``record``'s operation once now, whether it is due or not (``opstate refresh``, the
    page's button): the run's own poll (``gateway.fetch``, then ``ingest`` unless the answer
    drops against ``record``), reported to ``on_decision``.

    The poll schedule is left alone: an applied answer resets what ingest resets (not-found
    streak, lost mark), a 404 is reported but not counted towards ``lost``, and the next run
    polls it when it is due as before. No rate limit, budget or metrics: it is one request.
    """
    run = Run(
        store,
        gateway,
        settings,
        schedule_from_settings(settings),
        Budget(None, settings.reconcile_safety_margin_s),
        clock,
        DEFAULT_BACKOFF,
        on_decision,
        1,
        cloud,
    )
    try:
        polled = poll_record(run, record, run.lane(record))
    except Exception as exc:  # the store or the answer's ingest failed unexpectedly
        run.error("refresh failed", name=record.name, error=f"{type(exc).__name__}: {exc}")
        polled = Polled(None, True, None)
    return Refreshed(record, polled.decision, polled.found, run.tally.result.first_error)


__all__ = [
    "DecisionHook",
    "MarkDecision",
    "Refreshed",
    "RunDecision",
    "RunResult",
    "reconcile_once",
    "refresh_one",
    "schedule_from_settings",
]
