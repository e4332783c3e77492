"""One reconcile run: webhook health, discovery, then the due operations, oldest due first.

See docs/reconciler.md for the story; the parameters are documented on ``reconcile_once``.

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

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from opstate.config import Settings, parse_overdue
from opstate.domain.events import (
    EventError,
    InvalidEventError,
    UnsupportedEventError,
    check_future_skew,
)
from opstate.domain.model import Decision, OpEvent, OpRecord
from opstate.domain.names import GOOGLE_CLOUD, Backend, backend_of
from opstate.domain.reducer import apply_event
from opstate.ingest import Ingested, ingest_counted
from opstate.observability import (
    count,
    log_decision,
    log_fields,
    logger,
    record_retry_later,
    record_unsupported,
)
from opstate.reconcile.gateway import AuthError, CloudGateway, Gateway, GatewayError, Listed
from opstate.reconcile.pacing import (
    DEFAULT_BACKOFF,
    SYSTEM_CLOCK,
    Backoff,
    Budget,
    Clock,
    Throttle,
    TokenBucket,
)
from opstate.reconcile.poll_writer import Discovered, PollWriter, progress_of
from opstate.reconcile.schedule import Schedule
from opstate.reconcile.tally import (
    DecisionHook,
    MarkDecision,
    RunDecision,
    RunResult,
    Tally,
)
from opstate.store.port import Due, PollingStore, RetryableError, StoreUnavailableError

# Batch jobs asked per discovery page (the API caps it; fewer may come back).
DISCOVERY_PAGE_SIZE = 100
# Entries read from the open index per page.
DUE_PAGE_SIZE = 100


def schedule_from_settings(settings: Settings) -> Schedule:
    return Schedule(
        max_interval_s=settings.reconcile_max_interval_s,
        polled_only_max_interval_s=settings.reconcile_polled_only_max_interval_s,
        lost_after_misses=settings.reconcile_lost_after_runs,
        lost_after_s=settings.reconcile_lost_after_s,
        overdue_after_s=parse_overdue(settings.reconcile_overdue_hours),
    )


class _NoCloud:
    """The Cloud side of a deployment with no Google Cloud configuration: never a request."""

    scopes: tuple[tuple[str, str], ...] = ()

    def batch_pages(self, scope: tuple[str, str], page_size: int) -> Iterator[list[Listed]]:
        return iter(())

    def fetch(self, record: OpRecord) -> OpEvent:
        raise AuthError(
            "Google Cloud is not configured (set OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN or "
            "GOOGLE_APPLICATION_CREDENTIALS; docs/google-cloud.md)"
        )


class _Lane:
    """One backend of a run: what fetches its records, its rate limit, backoff and breaker,
    and whether its credentials were refused (then it makes no more requests this run)."""

    def __init__(
        self,
        backend: Backend,
        fetch: Callable[[OpRecord], OpEvent],
        rate: float,
        backoff: Backoff,
        clock: Clock,
    ) -> None:
        self.backend = backend
        self.fetch = fetch
        self.bucket = TokenBucket(rate, clock)
        self.throttle = Throttle(backoff, clock)
        self._refused = False
        self._lock = threading.Lock()

    @property
    def refused(self) -> bool:
        with self._lock:
            return self._refused

    def refuse(self) -> bool:
        """Mark the lane refused; True the first time (the caller reports it once)."""
        with self._lock:
            first = not self._refused
            self._refused = True
            return first


class _Run:
    def __init__(
        self,
        store: PollingStore,
        gateway: Gateway,
        settings: Settings,
        schedule: Schedule,
        budget: Budget,
        clock: Clock,
        backoff: Backoff,
        on_decision: DecisionHook | None,
        max_polls: int,
        cloud: CloudGateway | None = None,
    ) -> None:
        self.store = store
        self.gateway = gateway
        self.cloud: CloudGateway = cloud if cloud is not None else _NoCloud()
        self.settings = settings
        self.schedule = schedule
        self.budget = budget
        self.clock = clock
        self.on_decision = on_decision
        self.max_polls = max_polls
        self.tally = Tally()
        self.gemini = _Lane("gemini-api", gateway.fetch, settings.reconcile_max_rps, backoff, clock)
        self.google_cloud = _Lane(
            GOOGLE_CLOUD, self.cloud.fetch, settings.google_cloud_max_rps, backoff, clock
        )
        self.writer = PollWriter(store, self.tally, self.report)
        self.stop_reason: str | None = None
        self._lock = threading.Lock()

    def stop(self, reason: str) -> None:
        with self._lock:
            if self.stop_reason is None:
                self.stop_reason = reason

    def report(self, decision: RunDecision) -> None:
        if self.on_decision is None:
            return
        try:
            self.on_decision(decision)
        except Exception:
            name = decision.record.name if decision.record is not None else None
            logger.exception("on_decision hook failed", extra={"operation": name})

    def error(self, message: str, said: str | None = None, **context: object) -> None:
        """Log and count one error; ``said`` (what the server said) replaces the logged
        ``error`` in the sentence kept for the operator."""
        log_fields(logger.error, message, context)
        self.tally.error(
            error_sentence(message, {**context, "error": said or context.get("error")})
        )

    def lane(self, record: OpRecord) -> _Lane:
        return self.google_cloud if backend_of(record.name) == GOOGLE_CLOUD else self.gemini

    def refused(self, lane: _Lane, exc: AuthError, phase: str) -> None:
        """A lane's credentials are missing or refused: reported once per run."""
        self.tally.error(
            error_sentence(
                f"{lane.backend} credentials refused", {"status": exc.status, "error": exc.message}
            )
        )
        if lane.refuse():
            log_fields(
                logger.error,
                f"{lane.backend} credentials refused; its operations are left for the next run",
                {
                    "backend": lane.backend,
                    "phase": phase,
                    "status": exc.status,
                    "error": exc.message,
                },
            )
            if lane.backend == GOOGLE_CLOUD:
                count("GoogleCloudAuthFailed")

    def pace(self, lane: _Lane) -> bool:
        """Wait for the lane's rate limit and any backoff pause; False: do not start."""
        wait = lane.bucket.reserve()
        pause = max(wait, lane.throttle.wait_s())
        if lane.throttle.tripped:
            if lane is self.gemini:
                self.stop("api-unhealthy")
            else:
                self.refuse_unhealthy(lane)
            return False
        if not self.budget.left(pause):
            self.stop("budget")
            return False
        if pause > 0:
            self.clock.sleep(pause)
        return True

    def refuse_unhealthy(self, lane: _Lane) -> None:
        if lane.refuse():
            log_fields(
                logger.error,
                "backend unhealthy (breaker tripped); its operations are left for the next run",
                {"backend": lane.backend},
            )

    # --- ingest -------------------------------------------------------------------------------

    def ingest(self, event: OpEvent, phase: str) -> Decision | None:
        try:
            done = ingest_counted(
                self.store,
                event,
                max_attempts=self.settings.ingest_max_attempts,
                clock_ns=self.clock.now_ns,
                sleep=self.clock.sleep,
            )
        except RetryableError as exc:
            kind = "unavailable" if isinstance(exc, StoreUnavailableError) else "gave-up"
            record_retry_later(kind, str(exc), name=event.name, phase=phase)
            self.tally.error(f"the store did not take the event for {event.name}: {exc}")
            return None
        self.settle(done, phase)
        return done.decision

    def settle(self, done: Ingested, phase: str) -> None:
        decision = done.decision
        self.tally.decision(decision, done.conflicts)
        log_decision(decision, attempts=done.attempts, conflicts=done.conflicts, phase=phase)
        self.report(decision)

    def unsupported(self, exc: UnsupportedEventError, name: str, phase: str) -> None:
        record_unsupported(exc.reason, exc.message, name=name, phase=phase)
        self.tally.unsupported(exc.reason)

    def skewed(self, event: OpEvent) -> OpEvent | EventError:
        """``event``, or the ``invalid-time`` refusal of a time too far ahead of our clock (the
        answer is logged and skipped: applied, it would freeze the record)."""
        try:
            return check_future_skew(
                event, now_ns=self.clock.now_ns(), max_skew_s=self.settings.max_future_skew_s
            )
        except InvalidEventError as exc:
            return exc

    # --- 1. webhook health --------------------------------------------------------------------

    def check_webhooks(self) -> None:
        if not self.budget.left():
            self.stop("budget")
            return
        try:
            webhooks = self.gateway.webhooks()
        except GatewayError as exc:
            self.error("webhook listing failed", exc.sentence, status=exc.status, error=exc.message)
            return
        disabled = 0
        for webhook in webhooks:
            if webhook.state is None:
                logger.warning("webhook without a state", extra={"webhook_id": webhook.id})
            elif webhook.state != "enabled":
                disabled += 1
                logger.error(
                    "webhook not enabled",
                    extra={
                        "webhook": webhook.name or webhook.id,
                        "webhook_name": webhook.name,
                        "webhook_id": webhook.id,
                        "webhook_state": webhook.state,
                    },
                )
        count("WebhooksDisabled", disabled)

    # --- 2. discovery -------------------------------------------------------------------------

    def discover(self, pool: ThreadPoolExecutor) -> dict[str, Discovered]:
        """Ingest up to ``reconcile_max_pages`` pages of batch jobs from the Gemini API, then
        as many from each Google Cloud scope; name -> record after, and its progress."""
        seen: dict[str, Discovered] = {}
        if self.settings.reconcile_max_pages <= 0:
            return seen
        self.discover_pages(pool, partial(self.gateway.batch_pages, DISCOVERY_PAGE_SIZE), seen)
        for scope in self.cloud.scopes:
            if self.stop_reason is not None or self.google_cloud.refused:
                break
            try:
                self.discover_pages(
                    pool,
                    partial(self.cloud.batch_pages, scope, DISCOVERY_PAGE_SIZE),
                    seen,
                    scope="/".join(scope),
                )
            except AuthError as exc:
                self.refused(self.google_cloud, exc, "discover")
        return seen

    def discover_pages(
        self,
        pool: ThreadPoolExecutor,
        pages: Callable[[], Iterator[Sequence[Listed]]],
        seen: dict[str, Discovered],
        scope: str | None = None,
    ) -> None:
        """One listing's pages into ``seen`` (``AuthError`` escapes, other failures count)."""
        if not self.budget.left():
            self.stop("budget")
            return
        read = 0
        try:
            for page in pages():
                read += 1
                for name, discovered in pool.map(self.ingest_job, page):
                    if name is not None:
                        seen[name] = discovered
                if read >= self.settings.reconcile_max_pages:
                    break
                if not self.budget.left():
                    self.stop("budget")
                    break
        except AuthError:
            raise
        except GatewayError as exc:
            context = {"status": exc.status, "error": exc.message}
            self.error(
                "batch discovery failed",
                exc.sentence,
                **context,
                **({"scope": scope} if scope else {}),
            )

    def ingest_job(self, listed: tuple[str, OpEvent | EventError]) -> tuple[str | None, Discovered]:
        raw_name, answer = listed
        self.tally.add(discovered=1)
        if isinstance(answer, UnsupportedEventError):
            self.unsupported(answer, raw_name, "discover")
            return None, Discovered(None)
        if not isinstance(answer, EventError):
            answer = self.skewed(answer)
        if isinstance(answer, EventError):
            self.error("batch job refused", name=raw_name, code=answer.code, error=answer.message)
            return None, Discovered(None)
        try:
            decision = self.ingest(answer, "discover")
        except Exception as exc:
            self.error("ingest failed", name=answer.name, error=f"{type(exc).__name__}: {exc}")
            return None, Discovered(None)
        record = decision.record if decision is not None else None
        return answer.name, Discovered(record, progress_of(answer))

    # --- 3. polling ---------------------------------------------------------------------------

    def poll_due(self, pool: ThreadPoolExecutor, discovered: Mapping[str, Discovered]) -> None:
        """Poll the due entries with ``reconcile_workers`` workers, until done or stopped."""
        entries = iter(self.store.iter_due(self.clock.now_ns(), DUE_PAGE_SIZE))
        queue = _DueQueue(self, entries, discovered)
        workers = max(1, self.settings.reconcile_workers)
        futures = [pool.submit(self.poll_worker, queue) for _ in range(workers)]
        for future in futures:
            future.result()
        if self.stop_reason is not None:
            # Count what is still due, at most one more page (never the whole index).
            self.tally.add(remaining_due=queue.rest(DUE_PAGE_SIZE))

    def poll_worker(self, queue: _DueQueue) -> None:
        """One worker: take, pace and poll entries until the queue or the run says stop."""
        while (entry := queue.take()) is not None:
            lane = self.lane(entry.record)
            if lane.refused:
                self.tally.add(remaining_due=1)
                continue
            if not self.pace(lane):
                self.tally.add(remaining_due=1)
                if self.stop_reason is not None:
                    break
                continue
            self.tally.add(polled=1)
            try:
                self.poll_one(entry, lane)
            except Exception as exc:  # one bad operation never stops the others
                self.error(
                    "poll failed",
                    name=entry.record.name,
                    error=f"{type(exc).__name__}: {exc}",
                )

    def reschedule_discovered(self, entry: Due, discovered: Discovered) -> None:
        """The listing just read ``entry``: its next poll state, with the listed progress."""
        record = discovered.record
        if record is None or record.terminal:
            return
        poll, marks = self.schedule.after_poll(
            record, entry.poll, found=True, now_ns=self.clock.now_ns()
        )
        self.writer.write(record, entry.poll, poll, marks, discovered.progress)

    def fetch_checked(self, record: OpRecord, lane: _Lane) -> OpEvent:
        """The lane's answer for ``record``; ``invalid-time`` if it is too far ahead."""
        checked = self.skewed(lane.fetch(record))
        if isinstance(checked, EventError):
            raise checked
        return checked

    def poll_one(self, entry: Due, lane: _Lane) -> None:
        polled = self.poll_record(entry.record, lane)
        if polled.current is None:
            return  # left for the next run, or terminal now: nothing to schedule
        poll, marks = self.schedule.after_poll(
            polled.current, entry.poll, found=polled.found, now_ns=self.clock.now_ns()
        )
        event = polled.decision.event if polled.decision is not None else None
        self.writer.write(polled.current, entry.poll, poll, marks, progress_of(event))

    def poll_record(self, record: OpRecord, lane: _Lane) -> Polled:
        """One request for ``record``'s operation through its backend's lane and its answer
        through ingest (a run's poll and ``refresh_one``); scheduling is the caller's."""
        try:
            event = self.fetch(record, lane)
        except AuthError as exc:
            self.refused(lane, exc, "poll")
            return Polled(None, True, None)  # the entry stays due
        except GatewayError as exc:
            if not exc.not_found:
                return Polled(None, True, None)  # counted by fetch; the entry stays due
            lane.throttle.success()
            self.tally.add(not_found=1)
            log_fields(logger.warning, "operation not found; record kept", {"name": record.name})
            return Polled(record, False, None)
        if event is None:
            return Polled(record, True, None)  # refused or unsupported: counted by fetch
        # Reduced against the listed record first: a drop there is a drop against any newer
        # record too (records only move forward), so it needs no store read.
        probe = apply_event(record, event, now_ns=self.clock.now_ns())
        if not probe.applied:
            self.settle(Ingested(probe), "poll")
            return Polled(record, True, probe)
        decision = self.ingest(event, "poll")
        if decision is None:
            return Polled(None, True, None)  # store fault: the entry stays due
        current = decision.record
        if current is not None and current.terminal:
            current = None  # it left the open index: nothing to schedule
        return Polled(current, True, decision)

    def fetch(self, record: OpRecord, lane: _Lane) -> OpEvent | None:
        """The answer as an event; None when refused or unsupported (counted). A 404 and an
        ``AuthError`` are raised as they are; any other ``GatewayError`` is counted, fed to
        the lane's backoff and raised."""
        try:
            event = self.fetch_checked(record, lane)
        except AuthError:
            raise
        except GatewayError as exc:
            if not exc.not_found:
                self.failed(lane, record, exc)
            raise
        except EventError as exc:
            lane.throttle.success()
            self.refused_answer(record, exc)
            return None
        lane.throttle.success()
        return event

    def failed(self, lane: _Lane, record: OpRecord, exc: GatewayError) -> None:
        lane.throttle.failure(transient=exc.transient, retry_after_s=exc.retry_after_s)
        log_fields(
            logger.warning if exc.transient else logger.error,
            "poll failed; left for the next run",
            {"name": record.name, "status": exc.status, "error": exc.message},
        )
        self.tally.error(
            error_sentence("poll failed", {"name": record.name, "status": exc.status})
            + f": {exc.sentence}",
            throttled=int(exc.status == 429),
        )

    def refused_answer(self, record: OpRecord, exc: EventError) -> None:
        if isinstance(exc, UnsupportedEventError):
            self.unsupported(exc, record.name, "poll")
        else:
            self.error("answer refused", name=record.name, code=exc.code, error=exc.message)

    def emit(self) -> RunResult:
        return self.tally.emit(self.stop_reason, self.clock.now_ns())


@dataclass(frozen=True, slots=True)
class Polled:
    """What one poll came to: ``current``, the record to schedule next (None: nothing to
    schedule, it is terminal now or the poll is left for the next run); ``found``: False for a
    404; ``decision``: the decision on the answer, if there was one."""

    current: OpRecord | None
    found: bool
    decision: Decision | None


def error_sentence(message: str, context: Mapping[str, object]) -> str:
    """``poll failed for batches/x (HTTP 403): API key not valid``: one error as a sentence."""
    text = message
    name = context.get("name")
    if name:
        text += f" for {name}"
    status = context.get("status")
    if status is not None:
        text += f" (HTTP {status})"
    code = context.get("code")
    if code:
        text += f" ({code})"
    error = context.get("error")
    if error:
        text += f": {error}"
    return text


class _DueQueue:
    """A run's due entries, handed to its workers one at a time (under a lock)."""

    def __init__(
        self, run: _Run, entries: Iterator[Due], discovered: Mapping[str, Discovered]
    ) -> None:
        self.run = run
        self.entries = entries
        self.discovered = discovered
        self.started = 0
        self._lock = threading.Lock()

    def take(self) -> Due | None:
        """The next entry to poll; None once the run stopped, reached ``max_polls`` or ran out.

        An entry the discovery just read is rescheduled without a request (with the progress
        the listing carried), never handed out.
        """
        with self._lock:
            while (entry := self._next()) is not None:
                self.run.tally.seen_open(entry.record)
                name = entry.record.name
                if name not in self.discovered:
                    self.started += 1
                    return entry
                # The listing just read it: reschedule without a request.
                self.run.reschedule_discovered(entry, self.discovered[name])
            return None

    def _next(self) -> Due | None:
        run = self.run
        if run.stop_reason is not None:
            return None
        if run.max_polls and self.started >= run.max_polls:
            run.stop("max-polls")
            return None
        return next(self.entries, None)

    def rest(self, limit: int) -> int:
        """How many entries are left, counting at most ``limit``."""
        return sum(1 for _, _ in zip(range(limit), self.entries, strict=False))


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
) -> RunResult:
    """One reconcile run (see the module docstring).

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
    run = _Run(
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
        run.check_webhooks()
        discovered = run.discover(pool)
        run.poll_due(pool, discovered)
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
    run = _Run(
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
        polled = run.poll_record(record, run.lane(record))
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
