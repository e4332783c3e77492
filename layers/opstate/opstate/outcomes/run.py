"""One archive pass: ``archive_once`` copies the results of every due terminal record.

For each entry of ``ArchivingStore.iter_archive_due`` (soonest due first), by these rules:

1. a Google Cloud job (``plan.is_cloud_job``): status ``none``, its output's location from the
   record's ``output_location`` detail;
2. past its deadline: status ``expired``; a record that was ``pending`` / ``failed`` is lost
   (the notifier announces ``Operation Results Lost``); one never seen before (the previous
   release's records) is only marked, without a download;
3. otherwise the archiver claims it (``pending``, due again at the end of its lease: a second
   archiver's claim fails on the revision, so one archive is made), asks Gemini what it left
   (``Source.outputs``) and:
   - nothing to copy: ``none``;
   - an earlier complete copy under its prefix, checked by ``earlier`` (its ``summary.json``
     names this operation, every object read back is what it lists and what Gemini declared):
     ``archived``, recounted from the stored bytes, nothing downloaded (idempotent);
   - else every object is streamed through its ledger into the sink (``copy``), compared with
     what Gemini declared and committed, then ``summary.json`` last, then ``archived``. A
     failure (cut, 5xx, storage fault, a copy shorter than declared) leaves nothing that looks
     archived: ``failed`` with ``attempts`` and ``last_error``, due again after
     ``retry_delay_s``; a 404 from Gemini is ``expired`` (deleted before we got it).

Every state written is bounded (``summary``: it fits beside its record in one DynamoDB item).
Archiving never changes the record (its own conditional write, ``set_archive``). A store
fault is counted and left for the next pass. Any other failure of one entry (a refused write,
a bug) is that entry's ``failed`` (or, when even that cannot be written, counted as an error),
never the end of the pass. The pass stops starting entries when ``remaining_s()`` falls under
``safety_s``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from opstate.config import ResultsSettings
from opstate.domain.model import OpRecord
from opstate.domain.times import NS_PER_SECOND, format_time
from opstate.observability import count, log_fields, logger
from opstate.outcomes.copy import CopyError, copy_object
from opstate.outcomes.earlier import earlier_copy
from opstate.outcomes.ledger import BatchLedger
from opstate.outcomes.plan import SUMMARY_KEY, deadline_ns, is_cloud_job, prefix_of, retry_delay_s
from opstate.outcomes.price import cost_of
from opstate.outcomes.sink import Sink, SinkError, StoredObject
from opstate.outcomes.source import Outputs, Source, SourceError
from opstate.outcomes.summary import bounded_location, check_fits, summary_of, too_many
from opstate.store.port import (
    ARCHIVE_ARCHIVED,
    ARCHIVE_EXPIRED,
    ARCHIVE_FAILED,
    ARCHIVE_NONE,
    ARCHIVE_PENDING,
    ArchiveEntry,
    ArchiveState,
    ArchivingStore,
    RetryableError,
)

MAX_ERROR_TEXT = 300
MiB = 1024 * 1024


@dataclass
class ArchiveResult:
    """What one pass did (``opstate archive --once`` prints ``as_dict``)."""

    archived: int = 0
    failed: int = 0
    expired: int = 0
    none: int = 0
    bytes: int = 0
    skipped: int = 0  # claimed by another archiver meanwhile
    at_risk: int = 0  # still not archived with less than the warning margin left
    errors: int = 0  # store faults, and entries whose failure could not even be written
    remaining: int = 0  # due entries the pass did not reach

    def as_dict(self) -> dict[str, int]:
        return {
            "archived": self.archived,
            "failed": self.failed,
            "expired": self.expired,
            "none": self.none,
            "bytes": self.bytes,
            "skipped": self.skipped,
            "atRisk": self.at_risk,
            "errors": self.errors,
            "remaining": self.remaining,
        }


class Archiver:
    """One pass over the due archives (see the module docstring)."""

    def __init__(
        self,
        store: ArchivingStore,
        source: Source,
        sink: Sink,
        settings: ResultsSettings,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.store = store
        self.source = source
        self.sink = sink
        self.settings = settings
        self.clock_ns = clock_ns
        self.result = ArchiveResult()

    # -- the pass ----------------------------------------------------------------------------

    def run(
        self,
        remaining_s: Callable[[], float] | None = None,
        safety_s: float = 0.0,
        entries: Iterator[ArchiveEntry] | None = None,
    ) -> None:
        if entries is None:
            entries = self.store.iter_archive_due(self.clock_ns())
        for entry in entries:
            if remaining_s is not None and remaining_s() < safety_s:
                self.result.remaining = 1 + sum(1 for _ in entries)
                break
            try:
                self.one(entry)
            except Exception as exc:  # one entry's fault never ends the pass
                self.result.errors += 1
                log_fields(
                    logger.error,
                    "archive not written",
                    {"name": entry.record.name, "error": _text(exc)[:MAX_ERROR_TEXT]},
                )

    def one(self, entry: ArchiveEntry) -> None:
        record, state = entry.record, entry.archive
        now = self.clock_ns()
        rev = state.rev if state is not None else 0
        if is_cloud_job(record.name):
            location = bounded_location(str(record.details.get("output_location") or ""))
            self._settle(record, rev, ArchiveState(ARCHIVE_NONE, location=location), "none")
            return
        stored = state.deadline_ns if state is not None else 0
        deadline = deadline_ns(record, stored, self.settings.results_retention_s)
        if now >= deadline:
            self._expire(record, state, deadline, "the deadline passed before it was archived")
            return
        attempts = state.attempts if state is not None else 0
        last_error = state.last_error if state is not None else ""
        lease = now + int(self.settings.results_lease_s * NS_PER_SECOND)
        claim = ArchiveState(
            ARCHIVE_PENDING,
            created_ns=record.created_ns,
            attempts=attempts,
            last_error=last_error,
            deadline_ns=deadline,
            due_ns=lease,
        )
        if not self.store.set_archive(record.name, rev, claim):
            self.result.skipped += 1
            return
        self._copy(record, replace(claim, rev=rev + 1))

    # -- outcomes ----------------------------------------------------------------------------

    def _settle(self, record: OpRecord, rev: int, state: ArchiveState, what: str) -> bool:
        state = replace(state, created_ns=record.created_ns)
        check_fits(state)
        written = self.store.set_archive(record.name, rev, state)
        if not written:
            self.result.skipped += 1
            return False
        if what == "none":
            self.result.none += 1
        log_fields(
            logger.info,
            f"results {state.status}",
            {"name": record.name, "status": state.status, "location": state.location or None},
        )
        return True

    def _expire(
        self, record: OpRecord, state: ArchiveState | None, deadline: int, why: str
    ) -> None:
        rev = state.rev if state is not None else 0
        expired = ArchiveState(
            ARCHIVE_EXPIRED,
            attempts=state.attempts if state is not None else 0,
            last_error=why if state is None else (state.last_error or why),
            deadline_ns=deadline,
        )
        if not self._settle(record, rev, expired, "expired"):
            return
        self.result.expired += 1
        if state is not None:  # it was waiting for a copy: lost (the notifier announces it)
            count("ResultsLost")
            log_fields(
                logger.error,
                "results lost",
                {"name": record.name, "deadline": format_time(deadline), "why": why},
            )

    def _copy(self, record: OpRecord, claim: ArchiveState) -> None:
        """Copy (or find copied) what ``record`` left and settle it; any failure but a store
        fault is this entry's ``failed`` (``expired`` when Gemini no longer has it)."""
        try:
            outputs = self.source.outputs(record)
            claim = replace(claim, deadline_ns=outputs.expiration_ns or claim.deadline_ns)
            if not outputs.items and outputs.filtered_count is None:
                self._settle(record, claim.rev, replace(claim, status=ARCHIVE_NONE), "none")
                return
            if (why := too_many(outputs)) is not None:
                raise CopyError(why)
            summary = self._reuse(record, outputs) or self._write(record, outputs)
            archived = replace(
                claim,
                status=ARCHIVE_ARCHIVED,
                archived_ns=self.clock_ns(),
                due_ns=0,
                location=self.sink.location(f"{prefix_of(record)}/{SUMMARY_KEY}"),
                summary=summary,
            )
            if self._settle(record, claim.rev, archived, "archived"):
                self.result.archived += 1
                count("ResultsArchived")
        except RetryableError:
            raise
        except (SourceError, SinkError, CopyError) as exc:
            gone = isinstance(exc, SourceError) and exc.not_found
            self._failed(record, claim, str(exc), gone=gone)
        except Exception as exc:  # a refused write (an item DynamoDB will not take), a bug
            self._failed(record, claim, _text(exc), gone=False)

    def _failed(self, record: OpRecord, claim: ArchiveState, error: str, *, gone: bool) -> None:
        if gone:
            self._expire(record, claim, claim.deadline_ns, f"Gemini no longer has it: {error}")
            return
        attempts = claim.attempts + 1
        due = self.clock_ns() + int(
            retry_delay_s(attempts, self.settings.results_retry_s) * NS_PER_SECOND
        )
        failed = replace(
            claim,
            status=ARCHIVE_FAILED,
            attempts=attempts,
            last_error=error[:MAX_ERROR_TEXT],
            due_ns=due,
        )
        if self._settle(record, claim.rev, failed, "failed"):
            self.result.failed += 1
            count("ResultsFailed")
            left_s = (claim.deadline_ns - self.clock_ns()) / NS_PER_SECOND
            if left_s < self.settings.results_warn_s:
                self.result.at_risk += 1
                count("ResultsAtRisk")
                log_fields(
                    logger.error,
                    "results at risk",
                    {"name": record.name, "attempts": attempts, "seconds_left": int(left_s)},
                )

    # -- copying -----------------------------------------------------------------------------

    def _reuse(self, record: OpRecord, outputs: Outputs) -> dict[str, Any] | None:
        """The summary of a checked earlier copy (``earlier``), recounted and written over
        the summary.json found; or None."""
        found = earlier_copy(self.sink, record, outputs, self._max_line_bytes)
        if found is None:
            return None
        summary = self._priced(record, summary_of(record, outputs, *found))
        self._write_summary(record, summary)
        return summary

    @property
    def _max_line_bytes(self) -> int:
        return self.settings.results_max_line_mib * MiB

    def _write(self, record: OpRecord, outputs: Outputs) -> dict[str, Any]:
        objects: list[StoredObject] = []
        batch: BatchLedger | None = None
        prefix = prefix_of(record)
        for item in outputs.items:
            stored, ledger = copy_object(
                self.source,
                self.sink,
                f"{prefix}/{item.key}",
                record.name,
                item,
                self._max_line_bytes,
            )
            objects.append(stored)
            if isinstance(ledger, BatchLedger):
                batch = ledger
            self.result.bytes += stored.size
        summary = self._priced(record, summary_of(record, outputs, objects, batch))
        self._write_summary(record, summary)
        return summary

    def _priced(self, record: OpRecord, summary: dict[str, Any]) -> dict[str, Any]:
        """``summary`` with its ``cost`` (``price.cost_of``; a batch output only)."""
        if summary.get("rows") is not None:
            cost = cost_of(
                summary, record.details.get("model"), record.update_time_ns, self.clock_ns()
            )
            summary["cost"] = cost
            if cost["usd"] is None:
                count("ResultsUnpriced")
            else:
                count("ResultsCostUSD", float(cost["usd"]))
        return summary

    def _write_summary(self, record: OpRecord, summary: dict[str, Any]) -> None:
        """``summary.json``: ``summary`` with the operation's name and the time, written
        last (an object without its summary is never reported archived)."""
        document = {
            "name": record.name,
            **summary,
            "archivedAt": format_time(self.clock_ns()),
        }
        data = json.dumps(document, sort_keys=True, indent=1).encode("utf-8")
        with self.sink.open(f"{prefix_of(record)}/{SUMMARY_KEY}", name=record.name) as out:
            out.write(data)
            out.commit(hashlib.sha256(data).hexdigest())


def _text(exc: BaseException) -> str:
    """An exception as one line of a state's ``last_error`` or a log: its type and message."""
    return f"{type(exc).__name__}: {exc}"


def due_entries(store: ArchivingStore, names: list[str], now_ns: int) -> list[ArchiveEntry]:
    """The entries of ``names`` whose archive is due now (terminal, no settled status), read
    one by one (``GetItem``s: the bus trigger names its operation, no listing needed)."""
    found = []
    for name in dict.fromkeys(names):
        record = store.get(name)
        if record is None or not record.terminal:
            continue
        state = store.get_archive(name)
        if state is None or (state.open and state.due_ns <= now_ns):
            found.append(ArchiveEntry(record, state))
    return found


def archive_once(
    store: ArchivingStore,
    source: Source,
    sink: Sink,
    *,
    settings: ResultsSettings,
    clock_ns: Callable[[], int] = time.time_ns,
    remaining_s: Callable[[], float] | None = None,
    safety_s: float = 0.0,
    names: list[str] | None = None,
) -> ArchiveResult:
    """One pass (see the module docstring); returns what it did. With ``names``, only those
    operations (when due) instead of every due archive."""
    archiver = Archiver(store, source, sink, settings, clock_ns)
    if names is None:
        archiver.run(remaining_s, safety_s)
    else:
        archiver.run(remaining_s, safety_s, iter(due_entries(store, names, clock_ns())))
    result = archiver.result
    if result.bytes:
        count("ResultsBytes", result.bytes)
    log_fields(logger.info, "archive pass", result.as_dict())
    return result
