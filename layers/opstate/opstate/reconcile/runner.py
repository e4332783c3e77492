"""What every phase of one run shares: its store, gateways, lanes, budget and tally, when it
stops, and how it reports (``on_decision``, error lines and sentences, refused lanes), paces a
lane and ingests an answer. The phases themselves are ``discovery`` and ``polling``; ``run``
puts them together.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from opstate.config import Settings
from opstate.domain.events import (
    EventError,
    InvalidEventError,
    UnsupportedEventError,
    check_future_skew,
)
from opstate.domain.model import Decision, OpEvent, OpRecord
from opstate.domain.names import GOOGLE_CLOUD, backend_of
from opstate.ingest import UNKNOWN, Ingested, Unknown, ingest_counted
from opstate.observability import (
    count,
    log_decision,
    log_fields,
    logger,
    record_retry_later,
    record_unsupported,
)
from opstate.reconcile.gateway import AuthError, CloudGateway, Gateway
from opstate.reconcile.lanes import Lane, NoCloud
from opstate.reconcile.pacing import Backoff, Budget, Clock
from opstate.reconcile.poll_writer import PollWriter
from opstate.reconcile.schedule import Schedule
from opstate.reconcile.tally import DecisionHook, RunDecision, RunResult, Tally
from opstate.store.port import PollingStore, RetryableError, StoreUnavailableError


class Run:
    """One run's state and the steps its phases share (thread-safe where workers share it)."""

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
        self.cloud: CloudGateway = cloud if cloud is not None else NoCloud()
        self.settings = settings
        self.schedule = schedule
        self.budget = budget
        self.clock = clock
        self.on_decision = on_decision
        self.max_polls = max_polls
        self.tally = Tally()
        self.gemini = Lane("gemini-api", gateway.fetch, settings.reconcile_max_rps, backoff, clock)
        self.google_cloud = Lane(
            GOOGLE_CLOUD, self.cloud.fetch, settings.google_cloud_max_rps, backoff, clock
        )
        self.writer = PollWriter(
            store, self.tally, self.report, hold_within_ns=int(schedule.run_every_s * 1e9)
        )
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

    # --- the lanes ----------------------------------------------------------------------------

    def lane(self, record: OpRecord) -> Lane:
        return self.google_cloud if backend_of(record.name) == GOOGLE_CLOUD else self.gemini

    def refused(self, lane: Lane, exc: AuthError, phase: str) -> None:
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

    def pace(self, lane: Lane) -> bool:
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

    def refuse_unhealthy(self, lane: Lane) -> None:
        if lane.refuse():
            log_fields(
                logger.error,
                "backend unhealthy (breaker tripped); its operations are left for the next run",
                {"backend": lane.backend},
            )

    # --- ingest -------------------------------------------------------------------------------

    def ingest(
        self, event: OpEvent, phase: str, known: OpRecord | Unknown | None = UNKNOWN
    ) -> Decision | None:
        """``event`` through ingest (``known``: the record this run just read for it, None
        when it read none: no second read)."""
        try:
            done = ingest_counted(
                self.store,
                event,
                max_attempts=self.settings.ingest_max_attempts,
                clock_ns=self.clock.now_ns,
                sleep=self.clock.sleep,
                known=known,
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

    def emit(self) -> RunResult:
        return self.tally.emit(self.stop_reason, self.clock.now_ns())


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
