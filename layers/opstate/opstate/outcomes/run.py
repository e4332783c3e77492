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
   - a ``summary.json`` already under its prefix whose objects are all there (same size; on S3
     the same sha256 metadata): ``archived`` from it, nothing downloaded (idempotent);
   - else every object is streamed through its ledger into the sink and committed, then
     ``summary.json`` last, then ``archived``. A failure (cut, 5xx, storage fault) leaves
     nothing that looks archived: ``failed`` with ``attempts`` and ``last_error``, due again
     after ``retry_delay_s``; a 404 from Gemini is ``expired`` (deleted before we got it).

Archiving never changes the record (its own conditional write, ``set_archive``). A store
fault is counted and left for the next pass. The pass stops starting entries when
``remaining_s()`` falls under ``safety_s``.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from opstate.config import ResultsSettings
from opstate.domain.model import OpRecord
from opstate.domain.times import NS_PER_SECOND, format_time
from opstate.observability import count, log_fields, logger
from opstate.outcomes.ledger import BatchLedger, VideoLedger
from opstate.outcomes.plan import (
    SUMMARY_KEY,
    capped_errors,
    deadline_ns,
    is_cloud_job,
    prefix_of,
    retry_delay_s,
)
from opstate.outcomes.sink import Sink, SinkError, StoredObject
from opstate.outcomes.source import BATCH_OUTPUT, VIDEO, Output, Outputs, Source, SourceError
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

MAX_SUMMARY_BYTES = 1024 * 1024
MAX_ERROR_TEXT = 300


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
    errors: int = 0  # store faults
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


# Chunks (1 MiB each from the SDK) queued between the download and the writing thread.
WRITE_QUEUE_CHUNKS = 8


class _Tee:
    """Sends every chunk of a download through the ledger into the sink's writer, on two
    threads: this one (the download's) counts the lines, which holds the interpreter; a thread
    of its own writes each chunk to the sink and hashes it, which mostly does not (file writes
    and hashlib let go of the interpreter), so the copy, the count and the digest run side by
    side on two cores. The queue between them is bounded: memory stays bounded. A failure of
    the writer (a ``SinkError``; anything else it raises becomes one) stops the download at its
    next chunk, or is raised by ``close`` when no chunk came after it."""

    def __init__(self, ledger: BatchLedger | VideoLedger, out: Any) -> None:
        self.ledger = ledger
        self.count = ledger.count if isinstance(ledger, BatchLedger) else None
        self.out = out
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize=WRITE_QUEUE_CHUNKS)
        self.error: SinkError | None = None
        self.reported = False
        self.thread = threading.Thread(target=self._write, name="archive-write", daemon=True)
        self.thread.start()

    def _write(self) -> None:
        while (chunk := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.out.write(chunk)
                    self.ledger.digest(chunk)
                except SinkError as exc:  # raised by the next write() or by close()
                    self.error = exc
                except Exception as exc:
                    self.error = SinkError(f"writing the copy failed: {type(exc).__name__}: {exc}")
                    self.error.__cause__ = exc

    def write(self, data: bytes) -> int:
        if self.error is not None:
            self.reported = True
            raise self.error
        chunk = bytes(data)
        self.queue.put(chunk)
        if self.count is not None:
            self.count(chunk)
        return len(chunk)

    def close(self) -> None:
        """Wait until every chunk is written and digested; raise what the writer raised,
        unless a write() already did (the download failed with it)."""
        self.queue.put(None)
        self.thread.join()
        if self.error is not None and not self.reported:
            raise self.error


class _Failed(Exception):
    def __init__(self, message: str, *, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


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
            except RetryableError as exc:
                self.result.errors += 1
                log_fields(
                    logger.error,
                    "archive not written",
                    {"name": entry.record.name, "error": str(exc)[:MAX_ERROR_TEXT]},
                )

    def one(self, entry: ArchiveEntry) -> None:
        record, state = entry.record, entry.archive
        now = self.clock_ns()
        rev = state.rev if state is not None else 0
        if is_cloud_job(record.name):
            location = str(record.details.get("output_location") or "")
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
        written = self.store.set_archive(
            record.name, rev, replace(state, created_ns=record.created_ns)
        )
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
        try:
            outputs = self.source.outputs(record)
            deadline = outputs.expiration_ns or claim.deadline_ns
            claim = replace(claim, deadline_ns=deadline)
            if not outputs.items and outputs.filtered_count is None:
                self._settle(record, claim.rev, replace(claim, status=ARCHIVE_NONE), "none")
                return
            summary = self._existing(record, outputs) or self._write(record, outputs)
        except (SourceError, SinkError, _Failed) as exc:
            gone = (isinstance(exc, SourceError) and exc.not_found) or (
                isinstance(exc, _Failed) and exc.gone
            )
            self._failed(record, claim, str(exc), gone=gone)
            return
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

    def _existing(self, record: OpRecord, outputs: Outputs) -> dict[str, Any] | None:
        """The summary of a complete earlier copy (every object there, same size and, where
        the storage keeps it, same sha256), or None."""
        raw = self.sink.read(f"{prefix_of(record)}/{SUMMARY_KEY}", MAX_SUMMARY_BYTES)
        if raw is None:
            return None
        try:
            summary = json.loads(raw)
        except ValueError:
            return None
        objects = summary.get("objects") if isinstance(summary, dict) else None
        if not isinstance(objects, list) or len(objects) != len(outputs.items):
            return None
        for item, listed in zip(outputs.items, objects, strict=True):
            stored = self.sink.head(f"{prefix_of(record)}/{item.key}")
            if not isinstance(listed, dict) or stored is None:
                return None
            if stored.size != listed.get("bytes"):
                return None
            if stored.sha256 and stored.sha256 != listed.get("sha256"):
                return None
        stripped: dict[str, Any] = {
            k: v for k, v in summary.items() if k not in ("name", "expiresAt", "archivedAt")
        }
        return stripped

    def _write(self, record: OpRecord, outputs: Outputs) -> dict[str, Any]:
        objects: list[StoredObject] = []
        batch: BatchLedger | None = None
        for item in outputs.items:
            stored, ledger = self._object(record, item)
            objects.append(stored)
            if isinstance(ledger, BatchLedger):
                batch = ledger
            self.result.bytes += stored.size
        summary = _summary(record, outputs, objects, batch)
        document = {
            "name": record.name,
            **summary,
            "archivedAt": format_time(self.clock_ns()),
        }
        data = json.dumps(document, sort_keys=True, indent=1).encode("utf-8")
        with self.sink.open(f"{prefix_of(record)}/{SUMMARY_KEY}", name=record.name) as out:
            out.write(data)
            out.commit(hashlib.sha256(data).hexdigest())
        return summary

    def _object(
        self, record: OpRecord, item: Output
    ) -> tuple[StoredObject, BatchLedger | VideoLedger]:
        ledger: BatchLedger | VideoLedger = (
            BatchLedger() if item.what == BATCH_OUTPUT else VideoLedger()
        )
        with self.sink.open(f"{prefix_of(record)}/{item.key}", name=record.name) as out:
            tee = _Tee(ledger, out)
            try:
                if item.file is not None:
                    self.source.download(item.file, tee)
                elif item.data is not None:
                    tee.write(item.data)
            finally:
                tee.close()
            if isinstance(ledger, BatchLedger):
                ledger.finish()
            stored = out.commit(ledger.sha256)
        return stored, ledger


def _summary(
    record: OpRecord,
    outputs: Outputs,
    objects: list[StoredObject],
    batch: BatchLedger | None,
) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "kind": str(record.kind),
        "state": str(record.state),
        "objects": [o.as_dict() for o in objects],
        "rows": None,
        "errors": None,
        "usage": None,
        "requests": None,
    }
    if batch is not None:
        summary.update(
            rows=batch.rows.as_dict(),
            errors=capped_errors(batch.errors),
            usage=dict(batch.usage),
            requests=outputs.requests,
        )
    videos = [i for i in outputs.items if i.what == VIDEO]
    if videos or outputs.filtered_count is not None:
        summary["videos"] = {
            "count": len(videos),
            "filteredCount": outputs.filtered_count or 0,
            "filteredReasons": list(outputs.filtered_reasons),
        }
    return summary


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
