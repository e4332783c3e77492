"""The production store: one DynamoDB table, conditional writes on ``version``.

The store is split along its seams; this module holds the records and is the one import for
callers (it re-exports the names they read from the others):

- ``dynamodb_items``: the item shape (``name`` is the partition key, a sparse GSI
  ``open-index`` keys the open operations by shard and due time, a sparse GSI
  ``archive-index`` the unsettled archives, a sparse GSI ``retry-index`` the active retry
  roots) and its codec; pure;
- ``dynamodb_client``: the client, its retry policy and the fault mapping;
- ``dynamodb_table``: the calls on the table (GetItem, conditional writes, paginated reads);
- ``dynamodb_polls``: the open operations and their poll state (the reconciler's side);
- ``dynamodb_archives``: the archive state and queue (the archiver's side);
- ``dynamodb_retries``: the retry state (the retry runner's side; its due listing is a Query
  per shard of ``retry-index``).

The last three are imported on first use: a webhook or operations request reads and writes
records only, and its function's cold start does not load them.

A create is a full ``PutItem`` under ``attribute_not_exists(#name)``; a replace is an
``UpdateItem`` that sets every record attribute under ``#version = :expected`` (so the poll,
archive and retry states beside the record survive); both with
``ReturnValuesOnConditionCheckFailure=ALL_OLD``: a lost write hands back the item that beat it,
deserialised from the exception, never re-read.

Faults (throttling, 5xx, timeouts, connection errors, missing table or credentials) raise
``StoreUnavailableError``. A record whose details no store can hold is refused before the call,
and a ``ValidationException`` from a write (an item DynamoDB will never accept) raises
``RecordRejectedError``: both permanent, never retried. Other client errors are bugs and
propagate as ``ClientError``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from opstate.config import DEFAULT_RETENTION_DAYS
from opstate.domain.model import OpEvent, OpRecord
from opstate.store import dynamodb_counters
from opstate.store.counters import is_counter
from opstate.store.dynamodb_client import (
    CLIENT_CONFIG,
    make_client,
)
from opstate.store.dynamodb_items import (
    ARCHIVE_INDEX,
    DEFAULT_SHARDS,
    OPEN_INDEX,
    OPTIONAL_RECORD_ATTRS,
    RETRY_INDEX,
    deserialize_item,
    from_attr,
    item_from_record,
    plain,
    poll_from_item,
    record_from_item,
    record_from_wire,
    serialize_item,
    shard_of,
    to_attr,
)
from opstate.store.dynamodb_table import Table
from opstate.store.port import (
    ArchiveEntry,
    ArchiveState,
    Due,
    PollState,
    WriteOutcome,
    validate_record,
)

if TYPE_CHECKING:
    from opstate.store.retry_state import RetryState

_NAMES = {"#name": "name"}
# What a replace never sets: the key, and the index keys it keeps (``replace_if_version``).
_KEPT_ON_REPLACE = ("name", "open_update_ns", "poll_due_ns", "archive_queue", "archive_due_ns")

__all__ = [
    "ARCHIVE_INDEX",
    "CLIENT_CONFIG",
    "DEFAULT_SHARDS",
    "OPEN_INDEX",
    "RETRY_INDEX",
    "DynamoDBStore",
    "deserialize_item",
    "from_attr",
    "item_from_record",
    "make_client",
    "plain",
    "poll_from_item",
    "record_from_item",
    "record_from_wire",
    "serialize_item",
    "shard_of",
    "to_attr",
]


class DynamoDBStore:
    """The store port on one DynamoDB table (``dynamodb_items`` describes the item shape)."""

    def __init__(
        self,
        table_name: str,
        *,
        client: Any = None,
        shards: int = DEFAULT_SHARDS,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        clock: Callable[[], int] = time.time_ns,
        endpoint_url: str | None = None,
    ) -> None:
        if not table_name:
            raise ValueError("a DynamoDB table name is required")
        if shards < 1:
            raise ValueError("shards must be at least 1")
        if retention_days < 1:
            raise ValueError("retention_days must be at least 1")
        self.table_name = table_name
        self.shards = shards
        self.retention_days = retention_days
        self._clock = clock
        self._owns_client = client is None
        self._table = Table(client if client is not None else make_client(endpoint_url), table_name)

    @property
    def client(self) -> Any:
        """The low-level DynamoDB client this store calls."""
        return self._table.client

    # -- records -----------------------------------------------------------------------------

    def get(self, name: str) -> OpRecord | None:
        item = self._table.get(name)
        return record_from_wire(item) if item else None

    def get_many(self, names: Sequence[str]) -> dict[str, OpRecord]:
        """The records of ``names`` that exist: one eventually consistent ``BatchGetItem`` per
        100 names (``Table.get_batch``; the counters' items are no records)."""
        items = self._table.get_batch([n for n in names if not is_counter(n)])
        records = (record_from_wire(item) for item in items)
        return {record.name: record for record in records}

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        validate_record(record)
        return self._table.write(
            "PutItem",
            record,
            TableName=self.table_name,
            Item=serialize_item(self.item(record)),
            ConditionExpression="attribute_not_exists(#name)",
            ExpressionAttributeNames=dict(_NAMES),
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        validate_record(record)
        item = self.item(record)
        names: dict[str, str] = {"#version": "version"}
        values: dict[str, Any] = {":expected": {"N": str(expected_version)}}
        sets: list[str] = []
        for index, (key, value) in enumerate(sorted(item.items())):
            if key in _KEPT_ON_REPLACE:
                continue
            names[f"#a{index}"] = key
            values[f":a{index}"] = to_attr(value)
            sets.append(f"#a{index} = :a{index}")
        if "open_update_ns" in item:
            # Keep the due time the reconciler set; a lost operation (no key) rejoins, due now.
            names["#due"] = "open_update_ns"
            values[":due"] = to_attr(item["open_update_ns"])
            sets.append("#due = if_not_exists(#due, :due)")
            names["#pdue"] = "poll_due_ns"
            values[":pdue"] = to_attr(item["poll_due_ns"])
            sets.append("#pdue = if_not_exists(#pdue, :pdue)")
        if "archive_queue" in item:
            # Becoming terminal queues the archive; a refresh never re-queues a settled one.
            names["#aq"], names["#aqdue"] = "archive_queue", "archive_due_ns"
            values[":aq"] = to_attr(item["archive_queue"])
            values[":aqdue"] = to_attr(item["archive_due_ns"])
            sets.append("#aq = if_not_exists(#aq, :aq)")
            sets.append("#aqdue = if_not_exists(#aqdue, :aqdue)")
        removes = [k for k in OPTIONAL_RECORD_ATTRS if k not in item]
        removes += ["poll_misses", "poll_missing_since_ns", "lost_ns"]
        for index, key in enumerate(removes):
            names[f"#r{index}"] = key
        expression = "SET " + ", ".join(sets)
        expression += " REMOVE " + ", ".join(f"#r{i}" for i in range(len(removes)))
        return self._table.write(
            "UpdateItem",
            record,
            TableName=self.table_name,
            Key={"name": {"S": record.name}},
            UpdateExpression=expression,
            ConditionExpression="#version = :expected",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    def apply_if_newer(self, event: OpEvent, now_ns: int) -> WriteOutcome | None:
        """``event`` written in one conditional UpdateItem where the stored record lets the
        reducer's rule be the write's condition (``dynamodb_apply``); None when the event
        cannot be written that way. Written: ``current`` is the record it replaced; not
        written: the stored record (None: there is none), for the read-reduce-write."""
        from opstate.store.dynamodb_apply import apply_request

        request = apply_request(
            event, now_ns, shards=self.shards, retention_days=self.retention_days
        )
        if request is None:
            return None
        shape = OpRecord(event.name, event.state, event.update_time_ns, 1, event.source)
        return self._table.update_returning(shape, **request)

    def iter_all(self) -> Iterator[OpRecord]:
        """Every record, in table order (operator listing only: a paginated, consistent Scan;
        the counters' items, ``store.counters``, are no records)."""
        for item in self._table.pages("Scan", ConsistentRead=True):
            if is_counter(item.get("name")):
                continue
            yield record_from_item(item)

    def item(self, record: OpRecord) -> dict[str, Any]:
        """The python-valued item this store writes for ``record``."""
        return item_from_record(
            record, shards=self.shards, retention_days=self.retention_days, now_ns=self._clock()
        )

    # -- polls (dynamodb_polls) --------------------------------------------------------------

    def poll_state(self, name: str) -> PollState | None:
        """The poll state stored beside the record of ``name`` (consistent read), or None."""
        item = self._table.get(name)
        return poll_from_item(deserialize_item(item)) if item else None

    def get_progress(self, name: str) -> dict[str, int] | None:
        raw = (self._table.get(name, ProjectionExpression="progress") or {}).get("progress")
        value = plain(from_attr(raw)) if raw else None
        return value if isinstance(value, dict) else None

    def list_open(self, limit: int = 100) -> Sequence[OpRecord]:
        """Up to ``limit`` open records in open-index order (soonest due first; ties by name).

        ``iter_due(None)`` cut at ``limit``: a Query per shard, merged. GSI reads are
        eventually consistent: a record that just became terminal can still show up for a
        moment; callers re-read or re-ingest anyway.
        """
        if limit <= 0:
            return []
        page = min(limit, 1000)
        return [e.record for _, e in zip(range(limit), self.iter_due(None, page), strict=False)]

    def iter_due(self, now_ns: int | None, page_size: int = 100) -> Iterator[Due]:
        """Open entries due by ``now_ns`` (None: all), oldest due first: a Query per shard of
        ``open-index``, merged lazily (``dynamodb_polls.iter_due``)."""
        from opstate.store import dynamodb_polls

        return dynamodb_polls.iter_due(self._table, self.shards, now_ns, page_size)

    def set_poll(self, name: str, version: int, poll: PollState) -> bool:
        from opstate.store import dynamodb_polls

        return dynamodb_polls.set_poll(self._table, self.shards, name, version, poll)

    def iter_marked(self) -> Iterator[Due]:
        """Open records that are lost or overdue (operator listing: a filtered Scan)."""
        from opstate.store import dynamodb_polls

        return dynamodb_polls.iter_marked(self._table)

    # -- archives (dynamodb_archives) --------------------------------------------------------

    def get_archive(self, name: str) -> ArchiveState | None:
        from opstate.store import dynamodb_archives

        return dynamodb_archives.get_archive(self._table, name)

    def set_archive(self, name: str, expected_rev: int, state: ArchiveState) -> bool:
        """Write the archive state under its revision; an open one stays queued on
        ``archive-index`` (due at its ``due_ns``), a settled one leaves it."""
        from opstate.store import dynamodb_archives

        return dynamodb_archives.set_archive(self._table, name, expected_rev, state)

    def iter_archive_due(self, now_ns: int) -> Iterator[ArchiveEntry]:
        """Unsettled terminal records due by ``now_ns``, soonest due first, ties by name (a
        Query per shard of ``archive-index``: ``dynamodb_archives.iter_archive_due``)."""
        from opstate.store import dynamodb_archives

        return dynamodb_archives.iter_archive_due(self._table, now_ns)

    # -- retries (dynamodb_retries) ----------------------------------------------------------

    def get_retry(self, name: str) -> RetryState | None:
        from opstate.store import dynamodb_retries

        return dynamodb_retries.get_retry(self._table, name)

    def set_retry(self, name: str, expected_rev: int, state: RetryState) -> bool:
        """Write the retry state under its revision (a conditional UpdateItem)."""
        from opstate.store import dynamodb_retries

        return dynamodb_retries.set_retry(self._table, name, expected_rev, state)

    def iter_retry_due(self, now_ns: int) -> Iterator[tuple[OpRecord, RetryState]]:
        """Active retry roots due by ``now_ns``, soonest due first, ties by name (a Query per
        shard of ``retry-index``: ``dynamodb_retries.iter_retry_due``)."""
        from opstate.store import dynamodb_retries

        return dynamodb_retries.iter_retry_due(self._table, now_ns)

    # -- counters (store.counters) -------------------------------------------------------------

    def add_counter(self, counter: str, amount: int, cap: int) -> bool:
        return dynamodb_counters.add_counter(self._table, counter, amount, cap)

    def get_counter(self, counter: str) -> int:
        return dynamodb_counters.get_counter(self._table, counter)

    def close(self) -> None:
        """Close the client's connections, if this store built the client (a client passed in
        belongs to the caller)."""
        close = getattr(self.client, "close", None)
        if self._owns_client and callable(close):
            close()
