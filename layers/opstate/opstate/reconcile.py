"""The reconciler: discover batch jobs, poll every open operation, feed answers to ``ingest``.

Gemini pushes only terminal events, retries them for a day and can disable a failing endpoint,
so polling is what makes the record complete. Every answer of the API is turned into an
``OpEvent`` by the same normalisers the webhook path uses and passed through the very same
``ingest``: a slow poll that read RUNNING can never overwrite a SUCCEEDED that a webhook already
delivered, because the reducer only moves an operation forward.

One run (``reconcile_once``):

1. Webhook health: ``client.webhooks.list()``; every webhook whose state is not ``enabled`` is
   logged at error level and counted in the ``WebhooksDisabled`` metric (emitted on every run
   whose listing succeeded, 0 included, so an alarm can fire on ``>= 1``).
2. Discovery: ``client.batches.list`` page by page (at most ``reconcile_max_pages`` pages), and
   every job is ingested, so a batch created by any tool gets a record.
3. Polling: ``store.list_open(reconcile_open_limit)`` (oldest first), minus the batches step 2
   just read; each operation is fetched by kind (``batches.get``, ``operations.get`` with a
   ``GenerateVideosOperation`` or, for file-search imports and other LROs, an
   ``ImportFileOperation`` built from the name, ``interactions.get``) on a bounded thread pool,
   normalised and ingested. Operations that a ``PollMemory`` saw polled in an earlier run of
   this process go after the ones it did not, so when the time budget cuts runs short the next
   run continues with the oldest operations not yet polled (nothing starves).

Time budget: ``remaining_ms`` (the Lambda context's remaining time) is checked before every unit
of work; no new request starts once less than ``reconcile_safety_margin_s`` is left (keep the
margin above ``reconcile_http_timeout_s`` so a request in flight still finishes). What was not
started is ``remaining_open`` and waits for the next run.

Errors, per operation (one bad operation never stops the others):

- 404: the operation is *not* deleted. A not-found marker goes through ``ingest`` as a
  same-state refresh: ``details.not_found = {first_seen_at, last_seen_at, count}`` and an update
  time of exactly ``current update time + 1 ns`` (the smallest step the reducer accepts: it
  applies a same-rank event only with a strictly newer time). So the marker is monotonic (built
  from the record it refers to; if anything newer landed meanwhile it is dropped like any stale
  event), never changes the state, never outranks a real observation, and ``count`` says how
  many nanoseconds markers have added in total. Counted as ``NotFound``.
- 408 / 429 / 5xx / timeouts / connection errors: no retry within the run; the operation waits
  for the next run. A shared backoff (``Backoff``) makes every worker pause before its next
  request (exponential, capped, never past the budget), and after ``trip_after`` consecutive
  failures the run stops starting work (the API is unhealthy; the rest waits).
- Any other failure (4xx, an answer the normalisers refuse, ``RetryableError`` from ingest, an
  unexpected exception): counted in ``errors`` and logged; the run goes on.

This is the only module that imports ``google.genai``, and only inside functions, so importing
it stays cheap.
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit

from opstate.config import ConfigError, Settings
from opstate.events import (
    EventError,
    OpEvent,
    Source,
    UnsupportedEventError,
    from_batch_job,
    from_interaction,
    from_operation,
)
from opstate.ingest import ingest
from opstate.names import Kind, api_name
from opstate.observability import (
    count,
    decision_fields,
    logger,
    metrics,
    record_retry_later,
    record_unsupported,
)
from opstate.reducer import Decision, OpRecord, Reason
from opstate.store.port import RetryableError, Store, StoreUnavailableError
from opstate.times import format_time

if TYPE_CHECKING:
    from google import genai

# Batch jobs asked per discovery page (the API caps it; fewer may come back).
DISCOVERY_PAGE_SIZE = 100
# Pages of webhooks read per run (50 per page by default: far more than any project has).
MAX_WEBHOOK_PAGES = 5
# HTTP statuses after which the same request may succeed later.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

# LogRecord attributes the stdlib refuses in ``extra`` (``name``...): sent as Powertools'
# thread-local appended keys instead, so every line still says ``"name": <operation>``.
_RESERVED_LOG_KEYS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def _log(level: Callable[..., None], message: str, fields: Mapping[str, object]) -> None:
    reserved = {k: v for k, v in fields.items() if k in _RESERVED_LOG_KEYS}
    extra = {k: v for k, v in fields.items() if k not in _RESERVED_LOG_KEYS}
    if not reserved:
        level(message, extra=extra)
        return
    logger.thread_safe_append_keys(**reserved)
    try:
        level(message, extra=extra)
    finally:
        logger.thread_safe_remove_keys(list(reserved))


@dataclass(slots=True)
class RunResult:
    """What one run did. Returned, logged and emitted as metrics (one per field).

    - ``discovered``: batch jobs read from ``batches.list`` and ingested.
    - ``polled``: open operations a request was made for (whatever the answer).
    - ``applied`` / ``dropped``: ingest decisions of the run (discovered jobs, polled answers
      and not-found markers), plus answers dropped at normalisation (``unknown-state``).
    - ``not_found``: polls answered 404 (the record is kept, see the module docstring).
    - ``errors``: failures (API errors other than 404, timeouts, refused answers, store
      faults, a failed discovery page or webhook listing).
    - ``remaining_open``: open operations this run did not get to (budget or unhealthy API).
    - ``stopped_early``: the run stopped starting work before it was done.
    """

    discovered: int = 0
    polled: int = 0
    applied: int = 0
    dropped: int = 0
    not_found: int = 0
    errors: int = 0
    remaining_open: int = 0
    stopped_early: bool = False

    def as_dict(self) -> dict[str, int | bool]:
        return dict(asdict(self))


@dataclass(frozen=True, slots=True)
class Backoff:
    """The shared pause after transient API failures.

    After the n-th consecutive failure every worker waits ``min(max_s, base_s * 2**(n-1))``
    before its next request; a successful answer resets the count. After ``trip_after``
    consecutive failures (of any kind) the run stops starting work.
    """

    base_s: float = 0.5
    max_s: float = 5.0
    trip_after: int = 24

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return float(min(self.max_s, self.base_s * (2 ** min(failures - 1, 30))))


DEFAULT_BACKOFF = Backoff()


class PollMemory:
    """Which open operations this process polled, and in which run.

    ``reconcile_once`` polls the operations that were never polled here (or longest ago) first,
    oldest update time first among equals, so a run that the budget cuts short is continued by
    the next. A warm Lambda container (the function runs with reserved concurrency 1) keeps it
    between invocations; after a cold start the order is simply oldest first. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._polled_in: dict[str, int] = {}
        self._runs = 0

    def begin_run(self) -> int:
        with self._lock:
            self._runs += 1
            return self._runs

    def order(self, records: Sequence[OpRecord]) -> list[OpRecord]:
        """``records`` (oldest first) reordered: never polled here first, then by last run.

        Names that are no longer open are forgotten, so the memory stays as small as the list.
        """
        with self._lock:
            names = {r.name for r in records}
            self._polled_in = {n: run for n, run in self._polled_in.items() if n in names}
            polled_in = dict(self._polled_in)
        indexed = list(enumerate(records))
        indexed.sort(key=lambda item: (polled_in.get(item[1].name, 0), item[0]))
        return [record for _, record in indexed]

    def mark(self, name: str, run: int) -> None:
        with self._lock:
            self._polled_in[name] = run


class _Outcome(StrEnum):
    APPLIED = "applied"
    DROPPED = "dropped"
    NOT_FOUND = "not-found"
    TRANSIENT = "transient"
    ERROR = "error"


@dataclass(slots=True)
class _Tally:
    """Thread-safe counters of one run; metrics are emitted from them at the end."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    result: RunResult = field(default_factory=RunResult)
    applied_reasons: Counter[str] = field(default_factory=Counter)
    dropped_reasons: Counter[str] = field(default_factory=Counter)
    conflicts: int = 0
    throttled: int = 0

    def decision(self, decision: Decision) -> None:
        with self.lock:
            if decision.applied:
                self.result.applied += 1
                self.applied_reasons[str(decision.reason)] += 1
            else:
                self.result.dropped += 1
                self.dropped_reasons[str(decision.reason)] += 1
            self.conflicts += decision.conflicts

    def unsupported(self, reason: str) -> None:
        with self.lock:
            self.result.dropped += 1
            self.dropped_reasons[reason] += 1

    def add(self, **fields: int) -> None:
        with self.lock:
            for key, value in fields.items():
                setattr(self.result, key, getattr(self.result, key) + value)


class _Throttle:
    """Consecutive-failure count, shared pause and circuit breaker of one run."""

    def __init__(self, policy: Backoff, clock_s: Callable[[], float]) -> None:
        self._policy = policy
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._failures = 0
        self._not_before = 0.0

    def success(self) -> None:
        with self._lock:
            self._failures = 0

    def failure(self, *, transient: bool) -> None:
        with self._lock:
            self._failures += 1
            if transient:
                pause = self._policy.delay(self._failures)
                self._not_before = max(self._not_before, self._clock_s() + pause)

    def wait_s(self) -> float:
        with self._lock:
            return max(0.0, self._not_before - self._clock_s())

    @property
    def tripped(self) -> bool:
        with self._lock:
            return self._failures >= self._policy.trip_after


@dataclass(frozen=True, slots=True)
class _Failure:
    """An exception from the API, classified."""

    status: int | None
    transient: bool
    message: str

    @property
    def not_found(self) -> bool:
        return self.status == 404


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Timeouts and connection failures of whichever httpx flavour the SDK runs on."""
    found: list[type[BaseException]] = []
    for module_name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cls = getattr(module, "TransportError", None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    try:
        from google.genai._interactions import APIConnectionError

        found.append(APIConnectionError)
    except ImportError:  # pragma: no cover - older SDKs
        pass
    return tuple(found)


def classify(exc: BaseException) -> _Failure:
    """The HTTP status of an SDK exception (``None`` if there was no answer) and whether the
    same request may succeed later."""
    message = f"{type(exc).__name__}: {exc}"[:300]
    if isinstance(exc, _transport_errors()):
        return _Failure(None, True, message)
    status: object = None
    from google.genai import errors as genai_errors

    if isinstance(exc, genai_errors.APIError):
        status = exc.code
    else:
        status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return _Failure(status, status in TRANSIENT_STATUSES, message)
    return _Failure(None, False, message)


def not_found_event(record: OpRecord, now_ns: int) -> OpEvent:
    """The marker of one 404 answer for ``record``: a same-state refresh 1 ns newer.

    ``details.not_found`` keeps when the operation was first and last seen missing and how many
    times; ``first_seen_at`` survives later markers because it is copied from ``record``.
    """
    previous = record.details.get("not_found")
    previous = previous if isinstance(previous, Mapping) else {}
    raw_count = previous.get("count")
    seen = raw_count if isinstance(raw_count, int) and not isinstance(raw_count, bool) else 0
    now_text = format_time(now_ns)
    first = previous.get("first_seen_at")
    marker = {
        "first_seen_at": first if isinstance(first, str) else now_text,
        "last_seen_at": now_text,
        "count": seen + 1,
    }
    return OpEvent(
        record.name,
        record.state,
        record.update_time_ns + 1,
        Source.POLL,
        {"not_found": marker},
    )


def fetch_event(client: genai.Client, record: OpRecord) -> OpEvent:
    """Ask the API for ``record``'s operation and normalise the answer (SDK errors escape)."""
    kind = record.kind
    if kind is Kind.BATCH:
        event = from_batch_job(client.batches.get(name=record.name))
    elif kind is Kind.INTERACTION:
        interaction_id = record.name.split("/", 1)[1]
        event = from_interaction(client.interactions.get(interaction_id))
    else:
        from google.genai import types

        operation: types.GenerateVideosOperation | types.ImportFileOperation
        if kind is Kind.VIDEO:
            # The key has no model (models/-/operations/<id>): put it back to ask for it.
            full_name = api_name(record.name, record.details)
            operation = types.GenerateVideosOperation.model_validate({"name": full_name})
        else:
            # File-search imports and any other LRO: only name/done/error/response matter.
            operation = types.ImportFileOperation.model_validate({"name": record.name})
        event = from_operation(client.operations.get(operation))
    if event.name != record.name:
        # We asked for this resource: whatever spelling came back, it is this record.
        event = replace(event, name=record.name)
    return event


class _Run:
    """One reconcile pass (state shared by the worker threads)."""

    def __init__(
        self,
        store: Store,
        client: genai.Client,
        settings: Settings,
        remaining_ms: Callable[[], int] | None,
        memory: PollMemory,
        backoff: Backoff,
        clock_ns: Callable[[], int],
        clock_s: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.store = store
        self.client = client
        self.settings = settings
        self.remaining_ms = remaining_ms
        self.memory = memory
        self.clock_ns = clock_ns
        self.sleep = sleep
        self.tally = _Tally()
        self.throttle = _Throttle(backoff, clock_s)
        self.stop_reason: str | None = None
        self.oldest_open_age_s = 0.0
        self.open_listed = 0
        self._lock = threading.Lock()

    # --- budget -------------------------------------------------------------------------------

    def budget_left(self, extra_s: float = 0.0) -> bool:
        """True while more than the safety margin (plus ``extra_s``) is left."""
        if self.remaining_ms is None:
            return True
        margin_ms = (self.settings.reconcile_safety_margin_s + extra_s) * 1000.0
        return self.remaining_ms() > margin_ms

    def stop(self, reason: str) -> None:
        with self._lock:
            if self.stop_reason is None:
                self.stop_reason = reason

    # --- ingest -------------------------------------------------------------------------------

    def ingest(self, event: OpEvent, phase: str) -> _Outcome:
        try:
            decision = ingest(self.store, event, max_attempts=self.settings.ingest_max_attempts)
        except RetryableError as exc:
            kind = "unavailable" if isinstance(exc, StoreUnavailableError) else "gave-up"
            record_retry_later(kind, str(exc), name=event.name, phase=phase)
            self.tally.add(errors=1)
            return _Outcome.ERROR
        self.tally.decision(decision)
        fields = {**decision_fields(decision), "phase": phase}
        if decision.applied:
            _log(logger.info, "event applied", fields)
            return _Outcome.APPLIED
        if decision.reason == Reason.TERMINAL_CONFLICT:
            _log(logger.warning, "event dropped", fields)
        else:
            _log(logger.debug, "event dropped", fields)
        return _Outcome.DROPPED

    def unsupported(self, exc: UnsupportedEventError, name: str, phase: str) -> _Outcome:
        record_unsupported(exc.reason, exc.message, name=name, phase=phase)
        self.tally.unsupported(exc.reason)
        return _Outcome.DROPPED

    def error(self, message: str, **context: object) -> None:
        _log(logger.error, message, context)
        self.tally.add(errors=1)

    # --- 1. webhook health --------------------------------------------------------------------

    def check_webhooks(self) -> None:
        if not self.budget_left():
            self.stop("budget")
            return
        disabled = 0
        try:
            page_token: str | None = None
            for _ in range(MAX_WEBHOOK_PAGES):
                listing = self.client.webhooks.list(page_token=page_token)
                for webhook in listing.webhooks or []:
                    state = webhook.state
                    if state is None:
                        logger.warning("webhook without a state", extra={"webhook_id": webhook.id})
                    elif str(state) != "enabled":
                        disabled += 1
                        logger.error(
                            "webhook not enabled",
                            extra={
                                "webhook": webhook.name or webhook.id,
                                "webhook_name": webhook.name,
                                "webhook_id": webhook.id,
                                "webhook_state": str(state),
                            },
                        )
                page_token = listing.next_page_token or None
                if not page_token:
                    break
        except Exception as exc:
            failure = classify(exc)
            self.error("webhook listing failed", status=failure.status, error=failure.message)
            return
        count("WebhooksDisabled", disabled)

    # --- 2. discovery -------------------------------------------------------------------------

    def discover(self, pool: ThreadPoolExecutor) -> set[str]:
        """Ingest every batch job of up to ``reconcile_max_pages`` pages; the names read."""
        seen: set[str] = set()
        max_pages = self.settings.reconcile_max_pages
        if max_pages <= 0:
            return seen
        if not self.budget_left():
            self.stop("budget")
            return seen
        try:
            pager = self.client.batches.list(config={"page_size": DISCOVERY_PAGE_SIZE})
            pages = 1
            while True:
                for name in pool.map(self.ingest_job, pager.page):
                    if name is not None:
                        seen.add(name)
                if pages >= max_pages or not pager.config.get("page_token"):
                    break
                if not self.budget_left():
                    self.stop("budget")
                    break
                pager.next_page()
                pages += 1
        except Exception as exc:
            failure = classify(exc)
            self.error("batch discovery failed", status=failure.status, error=failure.message)
        return seen

    def ingest_job(self, job: Any) -> str | None:
        self.tally.add(discovered=1)
        raw_name = getattr(job, "name", None)
        try:
            event = from_batch_job(job)
        except UnsupportedEventError as exc:
            self.unsupported(exc, str(raw_name), "discover")
            return None
        except EventError as exc:
            self.error("batch job refused", name=str(raw_name), code=exc.code, error=exc.message)
            return None
        try:
            self.ingest(event, "discover")
        except Exception as exc:
            self.error("ingest failed", name=event.name, error=f"{type(exc).__name__}: {exc}")
        return event.name

    # --- 3. polling ---------------------------------------------------------------------------

    def note_oldest_open(self, records: Sequence[OpRecord]) -> None:
        """How long the oldest listed open operation has been open (since its record was
        created, else its server time), for the ``OldestOpenAgeSeconds`` alarm; 0 if none.
        Also how many were listed (``OpenOperations``, at most the open limit)."""
        self.open_listed = len(records)
        starts = [r.created_ns or r.update_time_ns for r in records]
        starts = [start for start in starts if start > 0]
        if starts:
            self.oldest_open_age_s = max(0.0, (self.clock_ns() - min(starts)) / 1e9)

    def poll_all(self, pool: ThreadPoolExecutor, skip: set[str]) -> None:
        if self.stop_reason is not None:
            records: Sequence[OpRecord] = self.store.list_open(self.settings.reconcile_open_limit)
            self.note_oldest_open(records)
            self.tally.add(remaining_open=sum(1 for r in records if r.name not in skip))
            return
        listed = self.store.list_open(self.settings.reconcile_open_limit)
        self.note_oldest_open(listed)
        if len(listed) >= self.settings.reconcile_open_limit:
            logger.warning(
                "open operations reach the listing limit; raise OPSTATE_RECONCILE_OPEN_LIMIT",
                extra={"limit": self.settings.reconcile_open_limit},
            )
        todo = [r for r in self.memory.order(listed) if r.name not in skip]
        run = self.memory.begin_run()
        if any(r.kind is Kind.INTERACTION for r in todo):
            _ = self.client.interactions  # build the lazy sub-client once, not in N threads
        started = 0
        queue_lock = threading.Lock()

        def next_record() -> OpRecord | None:
            nonlocal started
            with queue_lock:
                if started >= len(todo) or self.stop_reason is not None:
                    return None
                if self.throttle.tripped:
                    self.stop("api-unhealthy")
                    return None
                if not self.budget_left(self.throttle.wait_s()):
                    self.stop("budget")
                    return None
                record = todo[started]
                started += 1
                return record

        def worker() -> None:
            while (record := next_record()) is not None:
                pause = self.throttle.wait_s()
                if pause > 0:
                    self.sleep(pause)
                self.memory.mark(record.name, run)
                self.tally.add(polled=1)
                try:
                    self.poll_one(record)
                except Exception as exc:  # one bad operation never stops the others
                    self.error(
                        "poll failed", name=record.name, error=f"{type(exc).__name__}: {exc}"
                    )

        workers = max(1, min(self.settings.reconcile_workers, len(todo)))
        futures = [pool.submit(worker) for _ in range(workers)] if todo else []
        for future in futures:
            future.result()
        self.tally.add(remaining_open=len(todo) - started)

    def poll_one(self, record: OpRecord) -> _Outcome:
        try:
            event = fetch_event(self.client, record)
        except UnsupportedEventError as exc:
            self.throttle.success()
            return self.unsupported(exc, record.name, "poll")
        except EventError as exc:
            self.throttle.success()
            self.error("answer refused", name=record.name, code=exc.code, error=exc.message)
            return _Outcome.ERROR
        except Exception as exc:
            failure = classify(exc)
            if failure.not_found:
                self.throttle.success()
                return self.not_found(record)
            self.throttle.failure(transient=failure.transient)
            if failure.status == 429:
                with self.tally.lock:
                    self.tally.throttled += 1
            _log(
                logger.warning if failure.transient else logger.error,
                "poll failed; left for the next run",
                {"name": record.name, "status": failure.status, "error": failure.message},
            )
            self.tally.add(errors=1)
            return _Outcome.TRANSIENT if failure.transient else _Outcome.ERROR
        self.throttle.success()
        return self.ingest(event, "poll")

    def not_found(self, record: OpRecord) -> _Outcome:
        self.tally.add(not_found=1)
        event = not_found_event(record, self.clock_ns())
        _log(
            logger.warning,
            "operation not found; record kept",
            {"name": record.name, "count": event.details["not_found"]["count"]},
        )
        self.ingest(event, "not-found")
        return _Outcome.NOT_FOUND

    # --- metrics ------------------------------------------------------------------------------

    def emit(self) -> RunResult:
        result = self.tally.result
        result.stopped_early = self.stop_reason is not None
        count("Discovered", result.discovered)
        count("Polled", result.polled)
        count("Applied", result.applied)
        count("Dropped", result.dropped)
        count("NotFound", result.not_found)
        count("Errors", result.errors)
        count("RemainingOpen", result.remaining_open)
        count("StoppedEarly", int(result.stopped_early))
        count("Throttled", self.tally.throttled)
        count("OpenOperations", self.open_listed)
        metrics.add_metric(
            name="OldestOpenAgeSeconds", unit=MetricUnit.Seconds, value=self.oldest_open_age_s
        )
        for reason, n in sorted(self.tally.applied_reasons.items()):
            count("EventsApplied", n, reason=reason)
        for reason, n in sorted(self.tally.dropped_reasons.items()):
            count("EventsDropped", n, reason=reason)
        if self.tally.conflicts:
            count("IngestConflicts", self.tally.conflicts)
        logger.info(
            "reconcile run",
            extra={**result.as_dict(), "stop_reason": self.stop_reason},
        )
        return result


def reconcile_once(
    store: Store,
    client: genai.Client,
    *,
    settings: Settings,
    remaining_ms: Callable[[], int] | None = None,
    memory: PollMemory | None = None,
    backoff: Backoff = DEFAULT_BACKOFF,
    clock_ns: Callable[[], int] = time.time_ns,
    clock_s: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RunResult:
    """One reconcile pass: webhook health, discovery, polling (see the module docstring).

    ``remaining_ms`` returns the milliseconds left (``context.get_remaining_time_in_millis``);
    None means no budget. ``memory`` carries the poll order across runs (a fresh one: oldest
    first). Store faults while listing open operations escape (the run as a whole failed);
    everything per operation is counted instead.
    """
    run = _Run(
        store,
        client,
        settings,
        remaining_ms,
        memory if memory is not None else PollMemory(),
        backoff,
        clock_ns,
        clock_s,
        sleep,
    )
    with ThreadPoolExecutor(
        max_workers=max(1, settings.reconcile_workers), thread_name_prefix="reconcile"
    ) as pool:
        run.check_webhooks()
        seen = run.discover(pool)
        run.poll_all(pool, seen)
    return run.emit()


# --- wiring ------------------------------------------------------------------------------------

_MEMORY = PollMemory()

# Keys tried, in order, when the Gemini API key secret holds a JSON object.
SECRET_JSON_KEYS = ("GEMINI_API_KEY", "api_key", "apiKey", "key")


def _secret_api_key(secret_id: str, max_age_s: int) -> str:
    from aws_lambda_powertools.utilities.parameters import get_secret
    from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

    try:
        value = get_secret(secret_id, max_age=max_age_s)
    except GetParameterError as exc:
        raise ConfigError(f"could not read the Gemini API key secret: {exc}") from None
    text = value.strip() if isinstance(value, str) else ""
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, Mapping):
            for key in SECRET_JSON_KEYS:
                candidate = parsed.get(key)
                if isinstance(candidate, str) and candidate.strip():
                    return candidate.strip()
        raise ConfigError(
            "the Gemini API key secret is JSON without a string under one of "
            + ", ".join(SECRET_JSON_KEYS)
        )
    if not text:
        raise ConfigError("the Gemini API key secret is empty")
    return text


def api_key(settings: Settings) -> str:
    """The Gemini API key: from Secrets Manager if an ARN is set, else ``GEMINI_API_KEY``."""
    if settings.gemini_api_key_secret_arn:
        return _secret_api_key(settings.gemini_api_key_secret_arn, settings.secrets_cache_s)
    if settings.gemini_api_key:
        return settings.gemini_api_key
    raise ConfigError(
        "no Gemini API key: set OPSTATE_GEMINI_API_KEY_SECRET_ARN (Secrets Manager) or "
        "GEMINI_API_KEY"
    )


def make_client(settings: Settings) -> genai.Client:
    """The google-genai client of the reconciler.

    The base URL is never passed here, so ``GOOGLE_GEMINI_BASE_URL`` (read by the SDK) points
    it at any server. Requests time out after ``reconcile_http_timeout_s`` and are never
    retried by the SDK (its default would retry a 429 for up to ~30 s): the reconciler backs
    off itself and leaves the operation for the next run.
    """
    from google import genai
    from google.genai import types

    options = types.HttpOptions(
        timeout=max(1, int(settings.reconcile_http_timeout_s * 1000)),
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    return genai.Client(vertexai=False, api_key=api_key(settings), http_options=options)


def run_from_settings(
    settings: Settings, remaining_ms: Callable[[], int] | None = None
) -> RunResult:
    """Open the configured store and a client, run one pass, close both."""
    from opstate.store import store_from_url

    store = store_from_url(settings.store_url, settings)
    try:
        client = make_client(settings)
        try:
            return reconcile_once(
                store, client, settings=settings, remaining_ms=remaining_ms, memory=_MEMORY
            )
        finally:
            client.close()
    finally:
        store.close()
