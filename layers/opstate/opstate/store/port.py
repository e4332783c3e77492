"""The store port: the four operations ``ingest`` needs, and the errors every store raises.

Every write is conditional. A write that loses returns the record that beat it, so the caller
can reduce again without a second read (DynamoDB: ``ReturnValuesOnConditionCheckFailure=ALL_OLD``;
SQLite: a re-select in the same transaction).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from opstate.domain.details import InvalidDetailsError, check
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.times import NS_PER_SECOND
from opstate.store.counters import CountingStore

if TYPE_CHECKING:  # the retry state loads on first use: the webhook's init never needs it
    from opstate.store.retry_state import RetryState

SECONDS_PER_DAY = 86_400


class RetryableError(Exception):
    """The event was neither applied nor deliberately dropped: the sender must retry later."""


class StoreUnavailableError(RetryableError):
    """The store could not be reached or refused the call (throttling, timeout, 5xx)."""


class RecordRejectedError(Exception):
    """The store refused the record itself (DynamoDB ``ValidationException``, details no store
    can hold): a permanent refusal, retrying the same write can never succeed."""


def validate_record(record: OpRecord) -> None:
    """The write hook of every store: refuse (``RecordRejectedError``) a record whose details
    a store cannot hold, before the store is called (moto and SQLite would accept some of
    them; real DynamoDB would not)."""
    try:
        check(record.details)
    except InvalidDetailsError as exc:
        raise RecordRejectedError(f"record {record.name}: {exc}") from None


def check_retry(state: RetryState) -> str:
    """The write hook of ``set_retry`` on every store: the stored JSON of ``state``, refused
    (``RecordRejectedError``) when it is larger than ``MAX_RETRY_STATE_BYTES`` or no JSON
    document, before the store is called."""
    from opstate.store.retry_state import retry_json

    try:
        return retry_json(state)
    except ValueError as exc:
        raise RecordRejectedError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """The result of a conditional write.

    ``ok`` True: the record was written. ``ok`` False: the condition failed and ``current`` is
    the record that beat us (None if, for a replace, the record no longer exists).
    """

    ok: bool
    current: OpRecord | None = None


WRITTEN = WriteOutcome(ok=True)


@dataclass(frozen=True, slots=True)
class PollState:
    """The reconciler's bookkeeping of one open operation, stored beside its record.

    - ``due_ns``: when it is next due for a poll. It *is* the open index's sort key
      (DynamoDB ``open_update_ns``, SQLite ``open_ns``): the previous release wrote the update
      time there, which simply reads as "due since then".
    - ``misses`` / ``missing_since_ns``: consecutive not-found answers and when the streak began.
    - ``lost_ns``: when it was marked lost (0: not lost). A lost operation leaves the open
      index (it is no longer due) but keeps its record and state.
    - ``overdue_ns``: when it was announced overdue (0: not yet). Never cleared while open.

    Every applied ingest write (a real observation) clears ``misses``, ``missing_since_ns`` and
    ``lost_ns`` and puts a lost operation back into the open index, due at once; ``due_ns`` and
    ``overdue_ns`` survive it.
    """

    due_ns: int = 0
    misses: int = 0
    missing_since_ns: int = 0
    lost_ns: int = 0
    overdue_ns: int = 0
    # A running batch's batchStats as the last poll brought it (None: this write carries none;
    # a stored one is kept). Read back with ``ArchivingStore.get_progress``.
    progress: Mapping[str, int] | None = field(default=None, compare=False)

    @property
    def lost(self) -> bool:
        return self.lost_ns > 0


def expires_at(record: OpRecord, retention_days: int, now_ns: int) -> int:
    """When a terminal record may be deleted (epoch seconds; DynamoDB's TTL attribute, SQLite's
    ``purge_expired``): its applied time (or ``now_ns``) plus ``retention_days``
    (``StoreSettings.retention_days``, ``OPSTATE_RETENTION_DAYS``)."""
    applied_ns = record.applied_ns or now_ns
    return applied_ns // NS_PER_SECOND + retention_days * SECONDS_PER_DAY


def initial_due(record: OpRecord) -> int:
    """When a newly stored open record is first due: its update time, never after it was
    applied (a server clock ahead of ours must not delay the first poll)."""
    if record.applied_ns:
        return min(record.update_time_ns, record.applied_ns)
    return record.update_time_ns


@dataclass(frozen=True, slots=True)
class Due:
    """One entry of the open index: the record and its poll state."""

    record: OpRecord
    poll: PollState = field(default_factory=PollState)


# The archive status of a terminal record's results (``opstate.outcomes``).
ARCHIVE_PENDING = "pending"
ARCHIVE_ARCHIVED = "archived"
ARCHIVE_FAILED = "failed"
ARCHIVE_EXPIRED = "expired"
ARCHIVE_NONE = "none"
ARCHIVE_STATUSES = (
    ARCHIVE_PENDING,
    ARCHIVE_ARCHIVED,
    ARCHIVE_FAILED,
    ARCHIVE_EXPIRED,
    ARCHIVE_NONE,
)
# Not settled: the archiver still has work to do.
ARCHIVE_OPEN = frozenset({ARCHIVE_PENDING, ARCHIVE_FAILED})


@dataclass(frozen=True, slots=True)
class ArchiveState:
    """The archive of one terminal record's results, stored beside the record (like
    ``PollState``: its own conditional write, never the record's version, state or keys).

    - ``status``: one of ``ARCHIVE_STATUSES``; ``created_ns``: the record incarnation it
      belongs to (its ``created_ns``); ``rev``: counts the writes of this state (the condition
      of the next one; 0 = never written).
    - ``attempts`` / ``last_error``: failed copies so far and why the last one failed.
    - ``deadline_ns``: when Gemini deletes the results (``expiresAt``); ``due_ns``: when the
      archiver should look at it next (a claim sets it to the end of its lease).
    - ``archived_ns``, ``location`` (of ``summary.json``) and ``summary`` (``objects``,
      ``rows``, ``errors``, ``usage``, ``requests``, ``videos``; see ``opstate.outcomes.plan``).
    """

    status: str
    created_ns: int = 0
    rev: int = 0
    attempts: int = 0
    last_error: str = ""
    deadline_ns: int = 0
    due_ns: int = 0
    archived_ns: int = 0
    location: str = ""
    summary: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in ARCHIVE_STATUSES:
            raise ValueError(f"unknown archive status {self.status!r}")

    @property
    def open(self) -> bool:
        return self.status in ARCHIVE_OPEN

    def as_dict(self) -> dict[str, Any]:
        """The stored form (JSON-shaped: text, integers, maps and lists)."""
        return {
            "status": self.status,
            "created_ns": self.created_ns,
            "rev": self.rev,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "deadline_ns": self.deadline_ns,
            "due_ns": self.due_ns,
            "archived_ns": self.archived_ns,
            "location": self.location,
            "summary": dict(self.summary),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ArchiveState:
        def number(key: str) -> int:
            value = raw.get(key)
            return int(value) if value is not None else 0

        summary = raw.get("summary")
        return cls(
            status=str(raw.get("status") or ARCHIVE_PENDING),
            created_ns=number("created_ns"),
            rev=number("rev"),
            attempts=number("attempts"),
            last_error=str(raw.get("last_error") or ""),
            deadline_ns=number("deadline_ns"),
            due_ns=number("due_ns"),
            archived_ns=number("archived_ns"),
            location=str(raw.get("location") or ""),
            summary=dict(summary) if isinstance(summary, Mapping) else {},
        )


@dataclass(frozen=True, slots=True)
class ArchiveEntry:
    """A terminal record whose results are not settled, and its archive state (None: the
    archiver never wrote one, e.g. a record of the previous release)."""

    record: OpRecord
    archive: ArchiveState | None = None


@runtime_checkable
class Store(Protocol):
    """What every store provides. ``ingest`` uses only ``get``, ``put_if_absent`` and
    ``replace_if_version``; the reconciler uses ``PollingStore.iter_due``; operators use
    ``list_open`` and ``iter_all``."""

    def get(self, name: str) -> OpRecord | None:
        """The record of ``name`` (strongly consistent read), or None."""
        ...

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        """Create ``record`` unless a record of that name exists."""
        ...

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        """Replace the record of ``record.name`` if its stored version is ``expected_version``."""
        ...

    def list_open(self, limit: int = 100) -> Sequence[OpRecord]:
        """Up to ``limit`` non-terminal, not-lost records in open-index order: the soonest due
        first, which for records the reconciler never polled is the oldest update time first.
        (The reconciler itself pages with ``PollingStore.iter_due``.)"""
        ...

    def iter_all(self) -> Iterator[OpRecord]:
        """Every record (operator listing; may be a full scan, never used by ingest)."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...


@runtime_checkable
class ApplyingStore(Store, Protocol):
    """A store that can write an event without reading first (DynamoDB: the reducer's rule in
    the write's condition, ``store.dynamodb_apply``). ``ingest`` uses it when it has no record
    at hand; a miss costs nothing more than the read it replaces (the item comes back)."""

    def apply_if_newer(self, event: OpEvent, now_ns: int) -> WriteOutcome | None:
        """Write the record ``reducer.apply_event(stored, event, now_ns=now_ns)`` would, in one
        conditional call, when the condition can prove it is that record. ``ok``: written, and
        ``current`` is the record it replaced; not ``ok``: nothing written, ``current`` is the
        stored record (None: none) for the read-reduce-write. None: not tried."""
        ...


@runtime_checkable
class BatchReadingStore(Store, Protocol):
    """A store that reads many records in one request (discovery's page of listed jobs)."""

    def get_many(self, names: Sequence[str]) -> dict[str, OpRecord]:
        """The records of ``names`` that exist, by name; names without a record are absent from
        the result. A record may lag a write by a moment (DynamoDB: an eventually consistent
        ``BatchGetItem``, 100 keys a call, its unprocessed keys asked again a bounded number of
        times, then ``StoreUnavailableError``): records only move forward, so a caller reduces
        against it and writes under its version, never trusts it as the latest."""
        ...


@runtime_checkable
class PollingStore(Store, Protocol):
    """A store the reconciler can schedule on: the open index ordered by due time.

    Every store of this package provides it (memory, SQLite, DynamoDB).
    """

    def iter_due(self, now_ns: int | None, page_size: int = 100) -> Iterator[Due]:
        """Open, not-lost entries due at ``now_ns`` or earlier (``None``: all of them), oldest
        due first (ties by name), fetched lazily page by page (DynamoDB: a Query per shard and
        page, merged; never a Scan)."""
        ...

    def set_poll(self, name: str, version: int, poll: PollState) -> bool:
        """Store ``poll`` for the record of ``name`` if its version is still ``version``.

        A lost ``poll`` takes the record out of the open index. False when the condition
        failed (the record changed meanwhile: its poll state is left as that write left it).
        """
        ...

    def iter_marked(self) -> Iterator[Due]:
        """Every open record that is lost or was announced overdue (operator listing; may be a
        full scan, never used by the reconciler's run)."""
        ...


@runtime_checkable
class ArchivingStore(Store, Protocol):
    """A store that keeps an ``ArchiveState`` beside each terminal record (every store of this
    package: memory, SQLite, DynamoDB)."""

    def get_archive(self, name: str) -> ArchiveState | None:
        """The archive state stored beside the record of ``name`` (None: none yet)."""
        ...

    def set_archive(self, name: str, expected_rev: int, state: ArchiveState) -> bool:
        """Store ``state`` with ``rev = expected_rev + 1`` if the record of ``name`` is
        terminal, is the incarnation ``state.created_ns`` and its archive state's ``rev`` is
        still ``expected_rev`` (0: none yet). False when a condition failed. Never changes the
        record (version, state, details, keys) or its poll state."""
        ...

    def get_progress(self, name: str) -> dict[str, int] | None:
        """The batchStats the reconciler last stored beside ``name`` (``PollState.progress``),
        or None."""
        ...

    def iter_archive_due(self, now_ns: int) -> Iterator[ArchiveEntry]:
        """Terminal records whose results are not settled: without an archive state, or
        ``pending`` / ``failed`` with ``due_ns <= now_ns``; the soonest due first (without a
        state: due at once), ties by name. (DynamoDB: a filtered Scan.)"""
        ...


@runtime_checkable
class RetryingStore(Store, Protocol):
    """A store that keeps a ``RetryState`` (``store.retry_state``) beside each record, open or
    terminal (every store of this package: memory, SQLite, DynamoDB)."""

    def get_retry(self, name: str) -> RetryState | None:
        """The retry state stored beside the record of ``name`` (None: none, or no record)."""
        ...

    def set_retry(self, name: str, expected_rev: int, state: RetryState) -> bool:
        """Store ``state`` with ``rev = expected_rev + 1`` if the record of ``name`` exists, is
        the incarnation ``state.created_ns`` and its retry state's ``rev`` is still
        ``expected_rev`` (0: none yet). False when a condition failed. Open and terminal
        records alike; never changes the record (version, state, details, keys), its poll
        state or its archive state. A state whose compact JSON is larger than
        ``MAX_RETRY_STATE_BYTES`` is refused (``RecordRejectedError``) before the store is
        called."""
        ...

    def iter_retry_due(self, now_ns: int) -> Iterator[tuple[OpRecord, RetryState]]:
        """Records whose retry state is ``active`` with ``due_ns <= now_ns``, soonest due first,
        ties by name (SQLite: the partial index ``operations_retry``; DynamoDB: a Query per
        shard of the sparse GSI ``retry-index``; memory: a sorted walk). Records without a
        retry state never."""
        ...


@runtime_checkable
class RetryPassStore(RetryingStore, ArchivingStore, CountingStore, Protocol):
    """What a retry pass (``opstate.retry``) uses: records (``get`` and ingest's writes),
    retry states (``get_retry``, ``set_retry``, ``iter_retry_due``), archive states
    (``get_archive``: is a member settled) and counters (the daily budget). Every store of
    this package provides it."""
