"""The store port: the four operations ``ingest`` needs, and the errors every store raises.

Every write is conditional. A write that loses returns the record that beat it, so the caller
can reduce again without a second read (DynamoDB: ``ReturnValuesOnConditionCheckFailure=ALL_OLD``;
SQLite: a re-select in the same transaction).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from opstate.details import InvalidDetailsError, check
from opstate.reducer import OpRecord


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


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """The result of a conditional write.

    ``ok`` True: the record was written. ``ok`` False: the condition failed and ``current`` is
    the record that beat us (None if, for a replace, the record no longer exists).
    """

    ok: bool
    current: OpRecord | None = None


WRITTEN = WriteOutcome(ok=True)


@runtime_checkable
class Store(Protocol):
    """What every store provides. ``ingest`` uses only ``get``, ``put_if_absent`` and
    ``replace_if_version``; the reconciler uses ``list_open``; operators use ``iter_all``."""

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
        """Up to ``limit`` non-terminal records, oldest ``update_time_ns`` first."""
        ...

    def iter_all(self) -> Iterator[OpRecord]:
        """Every record (operator listing; may be a full scan, never used by ingest)."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...
