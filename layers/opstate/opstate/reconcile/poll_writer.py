"""Writing what a poll decided: the next ``PollState`` and the lost / overdue marks it reached.

Each mark is written on its own (``set_poll``, conditional on the record's version), so the
table's stream announces each once; a lost condition means the record moved on meanwhile and the
next run sees it afresh. A store fault is counted and left for the next run.

A batch's progress (``batch_stats``, ``progress_of`` its answer) goes with every write, whichever
way the run read the batch: polled, or listed by discovery (``Discovered``) and rescheduled
without a request.

``reschedule`` holds back the write that would only move an operation's due time to "the next
run" when nothing else changed: no mark, no new progress (none, or the stored one), the same
not-found streak. "The next run" is a due time of now (``Schedule.interval_s`` 0: younger than
15 minutes) or, when the run period is known (``hold_within_ns``, the schedule's
``run_every_s``), any due time no later than one period from now (an interval of 1/8 of the
age stays under a 5-minute period until the operation is 40 minutes old). Its due time stays
where it was, already due, so the next run polls it as it would have (or, by a few seconds of
the schedule's jitter, one run sooner: an extra poll, never a later one), and the open index
(whose sort key the due time is) is not rewritten. ``flush`` writes what was held back: the
run calls it when it left anything due (stopped early, or a lane refused), so every operation
it polled moves to the back as before and the operations that waited longest still come first.
At most ``HOLD_LIMIT`` are held per run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.times import format_time
from opstate.domain.views import PROGRESS_DETAIL
from opstate.observability import log_fields, logger, record_retry_later
from opstate.reconcile.schedule import Mark
from opstate.reconcile.tally import MarkDecision, RunDecision, Tally
from opstate.store.port import PollingStore, PollState, RetryableError

Progress = Mapping[str, int]

# Poll writes held back per run at most (beyond it they are written at once), so a run that
# stops on its time budget flushes them within about a second.
HOLD_LIMIT = 100


def progress_of(event: OpEvent | None) -> Progress | None:
    """A batch's progress in an answer (the gateway's ``batch_stats`` detail), whatever the
    reducer said of the answer (an equal update time drops the event, not its progress)."""
    progress = event.details.get(PROGRESS_DETAIL) if event is not None else None
    return progress if isinstance(progress, Mapping) else None


def same_progress(progress: Progress, stored: Progress | None) -> bool:
    """Whether ``progress`` is what the store already holds (``PollState.progress`` as read)."""
    return stored is not None and dict(progress) == dict(stored)


@dataclass(frozen=True, slots=True)
class Discovered:
    """One batch job the run's listing read: its record after the answer's ingest (None: the
    ingest failed) and the progress the listing carried, written when the run reschedules it."""

    record: OpRecord | None
    progress: Progress | None = None


class PollWriter:
    """Writes one run's poll states, counting into its ``tally`` and reporting each mark."""

    def __init__(
        self,
        store: PollingStore,
        tally: Tally,
        report: Callable[[RunDecision], None],
        *,
        hold_within_ns: int = 0,
    ) -> None:
        self.store = store
        self.hold_within_ns = max(0, hold_within_ns)
        self.tally = tally
        self.report = report
        self.held: list[tuple[OpRecord, PollState, PollState]] = []
        self._lock = threading.Lock()

    def reschedule(
        self,
        record: OpRecord,
        before: PollState,
        poll: PollState,
        marks: list[Mark],
        progress: Progress | None,
        now_ns: int,
    ) -> None:
        """``write``, unless the poll only made the operation due again by the next run
        (``poll.due_ns`` not after ``now_ns`` plus ``hold_within_ns``) and changed nothing
        else: then the write is held (see ``flush``) and the stored due time, already due,
        stays."""
        if (
            not marks
            and (progress is None or same_progress(progress, before.progress))
            and poll.due_ns <= now_ns + self.hold_within_ns
            and before.due_ns <= now_ns
            and replace(poll, due_ns=before.due_ns) == before
        ):
            with self._lock:
                if len(self.held) < HOLD_LIMIT:
                    self.held.append((record, before, poll))
                    return
        self.write(record, before, poll, marks, progress)

    def flush(self) -> int:
        """Write the held poll states (the run left something due); how many were held."""
        with self._lock:
            held, self.held = self.held, []
        for record, before, poll in held:
            self.write(record, before, poll, [])
        return len(held)

    def write(
        self,
        record: OpRecord,
        before: PollState,
        poll: PollState,
        marks: list[Mark],
        progress: Progress | None = None,
    ) -> None:
        """Write the poll state, with ``progress`` when there is one; each mark in its own
        write (one stream record each)."""
        if progress is not None:
            poll = replace(poll, progress=dict(progress))
        step = before
        for mark in marks:
            if mark is Mark.OVERDUE:
                step = PollState(
                    due_ns=poll.due_ns,
                    misses=poll.misses,
                    missing_since_ns=poll.missing_since_ns,
                    lost_ns=step.lost_ns,
                    overdue_ns=poll.overdue_ns,
                    progress=poll.progress,
                )
            else:
                step = poll
            try:
                written = self.store.set_poll(record.name, record.version, step)
            except RetryableError as exc:
                record_retry_later("unavailable", str(exc), name=record.name, phase="schedule")
                self.tally.error(
                    f"the store did not take the poll schedule of {record.name}: {exc}"
                )
                return
            if not written:
                return  # the record moved on meanwhile: the next run sees it afresh
            self.marked(mark, record, step)
        if step != poll:
            try:
                self.store.set_poll(record.name, record.version, poll)
            except RetryableError as exc:
                record_retry_later("unavailable", str(exc), name=record.name, phase="schedule")
                self.tally.error(
                    f"the store did not take the poll schedule of {record.name}: {exc}"
                )

    def marked(self, mark: Mark, record: OpRecord, poll: PollState) -> None:
        if mark is Mark.LOST:
            self.tally.add(lost=1)
            log_fields(
                logger.warning,
                "operation lost",
                {
                    "name": record.name,
                    "state": str(record.state),
                    "misses": poll.misses,
                    "missing_since": format_time(poll.missing_since_ns),
                },
            )
        else:
            self.tally.add(overdue=1)
            log_fields(
                logger.warning,
                "operation overdue",
                {"name": record.name, "state": str(record.state), "kind": str(record.kind)},
            )
        self.report(MarkDecision(mark, record, poll))
