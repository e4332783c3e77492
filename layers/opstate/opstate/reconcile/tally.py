"""What a run reports: its result, its decisions (the ``on_decision`` hook), its metrics."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from aws_lambda_powertools.metrics import MetricUnit

from opstate.domain.model import Decision, OpRecord
from opstate.observability import count, logger, metric_on, metrics
from opstate.reconcile.schedule import Mark
from opstate.store.port import PollState


@dataclass(frozen=True, slots=True)
class MarkDecision:
    """An operation newly marked ``lost`` or ``overdue`` (``record`` keeps its last state)."""

    mark: Mark
    record: OpRecord
    poll: PollState


RunDecision = Decision | MarkDecision
DecisionHook = Callable[[RunDecision], None]


@dataclass(slots=True)
class RunResult:
    """What one run did. Returned, logged and emitted as metrics (one per field).

    - ``discovered``: batch jobs read from ``batches.list`` and ingested.
    - ``polled``: due operations a request was made for (whatever the answer).
    - ``applied`` / ``dropped``: decisions on discovered jobs and polled answers (answers
      dropped at normalisation, ``unknown-state``, count as dropped).
    - ``not_found``: polls answered 404 (the record is kept).
    - ``lost`` / ``overdue``: operations newly marked so.
    - ``errors``: failures (API errors other than 404, refused answers, store faults, a failed
      discovery page or webhook listing).
    - ``throttled``: polls answered 429 (also counted in ``errors``).
    - ``remaining_due``: due entries this run did not get to, counted up to one more index
      page (a lower bound: the index is not read to its end to count them).
    - ``stopped_early``: the run stopped starting work before it was done.
    - ``first_error``: the first error, as a sentence (None: no error). Not a metric and not
      in ``as_dict``: the CLI prints it.
    """

    discovered: int = 0
    polled: int = 0
    applied: int = 0
    dropped: int = 0
    not_found: int = 0
    lost: int = 0
    overdue: int = 0
    errors: int = 0
    throttled: int = 0
    remaining_due: int = 0
    stopped_early: bool = False
    first_error: str | None = None

    def as_dict(self) -> dict[str, int | bool]:
        fields: dict[str, int | bool] = {
            k: v for k, v in asdict(self).items() if k != "first_error"
        }
        return fields

    @property
    def answers(self) -> int:
        """Outcomes that are useful work: events decided (applied or dropped, discovered or
        polled), not-found answers counted towards lost, lost / overdue marks written."""
        return self.applied + self.dropped + self.not_found + self.lost + self.overdue

    @property
    def failed(self) -> bool:
        """The run did no useful work because of errors (``opstate reconcile --once`` exits 1)."""
        return self.errors > 0 and self.answers == 0


@dataclass(slots=True)
class Tally:
    """Thread-safe counters of one run; its metrics are emitted from them at the end."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    result: RunResult = field(default_factory=RunResult)
    applied_reasons: Counter[str] = field(default_factory=Counter)
    dropped_reasons: Counter[str] = field(default_factory=Counter)
    conflicts: int = 0
    oldest_start_ns: int = 0

    def decision(self, decision: Decision, conflicts: int = 0) -> None:
        """Count one decision, and the conditional writes ingest lost before it."""
        with self.lock:
            if decision.applied:
                self.result.applied += 1
                self.applied_reasons[str(decision.reason)] += 1
            else:
                self.result.dropped += 1
                self.dropped_reasons[str(decision.reason)] += 1
            self.conflicts += conflicts

    def unsupported(self, reason: str) -> None:
        with self.lock:
            self.result.dropped += 1
            self.dropped_reasons[reason] += 1

    def error(self, sentence: str, throttled: int = 0) -> None:
        """Count one error; the first one is kept as ``RunResult.first_error``."""
        with self.lock:
            self.result.errors += 1
            self.result.throttled += throttled
            if self.result.first_error is None:
                self.result.first_error = sentence

    def add(self, **fields: int) -> None:
        with self.lock:
            for key, value in fields.items():
                setattr(self.result, key, getattr(self.result, key) + value)

    def seen_open(self, record: OpRecord) -> None:
        start = record.created_ns or record.update_time_ns
        with self.lock:
            if start > 0 and (self.oldest_start_ns == 0 or start < self.oldest_start_ns):
                self.oldest_start_ns = start

    def emit(self, stop_reason: str | None, now_ns: int) -> RunResult:
        """Log the run and emit its metrics (one per result field, plus the ones below)."""
        result = self.result
        result.stopped_early = stop_reason is not None
        for key, value in result.as_dict().items():
            count(METRIC_NAMES[key], int(value))
        oldest = self.oldest_start_ns
        age = max(0.0, (now_ns - oldest) / 1e9) if oldest else 0.0
        if metric_on("OldestOpenAgeSeconds", age):
            metrics.add_metric(name="OldestOpenAgeSeconds", unit=MetricUnit.Seconds, value=age)
        for reason, n in sorted(self.applied_reasons.items()):
            count("EventsApplied", n, reason=reason)
        for reason, n in sorted(self.dropped_reasons.items()):
            count("EventsDropped", n, reason=reason)
        if self.conflicts:
            count("IngestConflicts", self.conflicts)
        logger.info("reconcile run", extra={**result.as_dict(), "stop_reason": stop_reason})
        return result


METRIC_NAMES = {
    "discovered": "Discovered",
    "polled": "Polled",
    "applied": "Applied",
    "dropped": "Dropped",
    "not_found": "NotFound",
    "lost": "OperationsLost",
    "overdue": "OperationsOverdue",
    "errors": "Errors",
    "throttled": "Throttled",
    "remaining_due": "RemainingDue",
    "stopped_early": "StoppedEarly",
}
