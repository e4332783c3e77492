"""Writing what a poll decided: the next ``PollState`` and the lost / overdue marks it reached.

Each mark is written on its own (``set_poll``, conditional on the record's version), so the
table's stream announces each once; a lost condition means the record moved on meanwhile and the
next run sees it afresh. A store fault is counted and left for the next run.

A batch's progress (``batch_stats``, ``progress_of`` its answer) goes with every write, whichever
way the run read the batch: polled, or listed by discovery (``Discovered``) and rescheduled
without a request.
"""

from __future__ import annotations

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


def progress_of(event: OpEvent | None) -> Progress | None:
    """A batch's progress in an answer (the gateway's ``batch_stats`` detail), whatever the
    reducer said of the answer (an equal update time drops the event, not its progress)."""
    progress = event.details.get(PROGRESS_DETAIL) if event is not None else None
    return progress if isinstance(progress, Mapping) else None


@dataclass(frozen=True, slots=True)
class Discovered:
    """One batch job the run's listing read: its record after the answer's ingest (None: the
    ingest failed) and the progress the listing carried, written when the run reschedules it."""

    record: OpRecord | None
    progress: Progress | None = None


class PollWriter:
    """Writes one run's poll states, counting into its ``tally`` and reporting each mark."""

    def __init__(
        self, store: PollingStore, tally: Tally, report: Callable[[RunDecision], None]
    ) -> None:
        self.store = store
        self.tally = tally
        self.report = report

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
