"""The third phase of a run: polling the due entries of the open index, oldest due first.

``poll_due`` hands the entries (``PollingStore.iter_due(now)``, paged lazily) to
``reconcile_workers`` workers through a locked ``DueQueue``; an entry discovery just read is
rescheduled without a request. Each worker paces the entry's lane, then ``poll_one``: the
lane's answer through ``poll_record`` (reduced against the listed record first; only an answer
that would change it goes through ``ingest``), and the next ``PollState`` from the
``Schedule``. ``poll_record`` is also ``refresh_one``'s poll.

A 404 never changes the record: it counts towards ``lost``. A transient failure (408, 429,
5xx, timeout) leaves the entry due and feeds the lane's backoff and breaker; refused
credentials stop the lane for the rest of the run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from opstate.domain.events import EventError, UnsupportedEventError
from opstate.domain.model import Decision, OpEvent, OpRecord
from opstate.domain.names import Kind
from opstate.domain.reducer import apply_event
from opstate.ingest import Ingested
from opstate.observability import log_fields, logger
from opstate.reconcile.gateway import AuthError, GatewayError
from opstate.reconcile.lanes import Lane
from opstate.reconcile.poll_writer import Discovered, progress_of
from opstate.reconcile.runner import Run, error_sentence
from opstate.store.port import Due

# Entries read from the open index per page.
DUE_PAGE_SIZE = 100


@dataclass(frozen=True, slots=True)
class Polled:
    """What one poll came to: ``current``, the record to schedule next (None: nothing to
    schedule, it is terminal now or the poll is left for the next run); ``found``: False for a
    404; ``decision``: the decision on the answer, if there was one."""

    current: OpRecord | None
    found: bool
    decision: Decision | None


class DueQueue:
    """A run's due entries, handed to its workers one at a time (under a lock)."""

    def __init__(
        self, run: Run, entries: Iterator[Due], discovered: Mapping[str, Discovered]
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
                if entry.record.kind is Kind.JOB:
                    continue  # opstate's own job (issue 46): the retry pass moves it
                self.run.tally.seen_open(entry.record)
                name = entry.record.name
                if name not in self.discovered:
                    self.started += 1
                    return entry
                # The listing just read it: reschedule without a request.
                reschedule_discovered(self.run, entry, self.discovered[name])
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


def poll_due(run: Run, pool: ThreadPoolExecutor, discovered: Mapping[str, Discovered]) -> None:
    """Poll the due entries with ``reconcile_workers`` workers, until done or stopped."""
    entries = iter(run.store.iter_due(run.clock.now_ns(), DUE_PAGE_SIZE))
    queue = DueQueue(run, entries, discovered)
    workers = max(1, run.settings.reconcile_workers)
    futures = [pool.submit(poll_worker, run, queue) for _ in range(workers)]
    for future in futures:
        future.result()
    if run.stop_reason is not None:
        # Count what is still due, at most one more page (never the whole index).
        run.tally.add(remaining_due=queue.rest(DUE_PAGE_SIZE))
    if run.stop_reason is not None or run.tally.result.remaining_due:
        # Something is left due: every operation polled moves to the back, held ones too.
        run.writer.flush()


def poll_worker(run: Run, queue: DueQueue) -> None:
    """One worker: take, pace and poll entries until the queue or the run says stop."""
    while (entry := queue.take()) is not None:
        lane = run.lane(entry.record)
        if lane.refused:
            run.tally.add(remaining_due=1)
            continue
        if not run.pace(lane):
            run.tally.add(remaining_due=1)
            if run.stop_reason is not None:
                break
            continue
        run.tally.add(polled=1)
        try:
            poll_one(run, entry, lane)
        except Exception as exc:  # one bad operation never stops the others
            run.error(
                "poll failed",
                name=entry.record.name,
                error=f"{type(exc).__name__}: {exc}",
            )


def reschedule_discovered(run: Run, entry: Due, discovered: Discovered) -> None:
    """The listing just read ``entry``: its next poll state, with the listed progress."""
    record = discovered.record
    if record is None or record.terminal:
        return
    now_ns = run.clock.now_ns()
    poll, marks = run.schedule.after_poll(record, entry.poll, found=True, now_ns=now_ns)
    run.writer.reschedule(record, entry.poll, poll, marks, discovered.progress, now_ns)


def poll_one(run: Run, entry: Due, lane: Lane) -> None:
    polled = poll_record(run, entry.record, lane)
    if polled.current is None:
        return  # left for the next run, or terminal now: nothing to schedule
    now_ns = run.clock.now_ns()
    poll, marks = run.schedule.after_poll(
        polled.current, entry.poll, found=polled.found, now_ns=now_ns
    )
    event = polled.decision.event if polled.decision is not None else None
    run.writer.reschedule(polled.current, entry.poll, poll, marks, progress_of(event), now_ns)


def poll_record(run: Run, record: OpRecord, lane: Lane) -> Polled:
    """One request for ``record``'s operation through its backend's lane and its answer
    through ingest (a run's poll and ``refresh_one``); scheduling is the caller's."""
    try:
        event = fetch(run, record, lane)
    except AuthError as exc:
        run.refused(lane, exc, "poll")
        return Polled(None, True, None)  # the entry stays due
    except GatewayError as exc:
        if not exc.not_found:
            return Polled(None, True, None)  # counted by fetch; the entry stays due
        lane.throttle.success()
        run.tally.add(not_found=1)
        log_fields(logger.warning, "operation not found; record kept", {"name": record.name})
        return Polled(record, False, None)
    if event is None:
        return Polled(record, True, None)  # refused or unsupported: counted by fetch
    # Reduced against the listed record first: a drop there is a drop against any newer
    # record too (records only move forward), so it needs no store read.
    probe = apply_event(record, event, now_ns=run.clock.now_ns())
    if not probe.applied:
        run.settle(Ingested(probe), "poll")
        return Polled(record, True, probe)
    decision = run.ingest(event, "poll", known=record)  # a stale one comes back on the write
    if decision is None:
        return Polled(None, True, None)  # store fault: the entry stays due
    current = decision.record
    if current is not None and current.terminal:
        current = None  # it left the open index: nothing to schedule
    return Polled(current, True, decision)


def fetch_checked(run: Run, record: OpRecord, lane: Lane) -> OpEvent:
    """The lane's answer for ``record``; ``invalid-time`` if it is too far ahead."""
    checked = run.skewed(lane.fetch(record))
    if isinstance(checked, EventError):
        raise checked
    return checked


def fetch(run: Run, record: OpRecord, lane: Lane) -> OpEvent | None:
    """The answer as an event; None when refused or unsupported (counted). A 404 and an
    ``AuthError`` are raised as they are; any other ``GatewayError`` is counted, fed to the
    lane's backoff and raised."""
    try:
        event = fetch_checked(run, record, lane)
    except AuthError:
        raise
    except GatewayError as exc:
        if not exc.not_found:
            failed(run, lane, record, exc)
        raise
    except EventError as exc:
        lane.throttle.success()
        refused_answer(run, record, exc)
        return None
    lane.throttle.success()
    return event


def failed(run: Run, lane: Lane, record: OpRecord, exc: GatewayError) -> None:
    lane.throttle.failure(transient=exc.transient, retry_after_s=exc.retry_after_s)
    log_fields(
        logger.warning if exc.transient else logger.error,
        "poll failed; left for the next run",
        {"name": record.name, "status": exc.status, "error": exc.message},
    )
    run.tally.error(
        error_sentence("poll failed", {"name": record.name, "status": exc.status})
        + f": {exc.sentence}",
        throttled=int(exc.status == 429),
    )


def refused_answer(run: Run, record: OpRecord, exc: EventError) -> None:
    if isinstance(exc, UnsupportedEventError):
        run.unsupported(exc, record.name, "poll")
    else:
        run.error("answer refused", name=record.name, code=exc.code, error=exc.message)
