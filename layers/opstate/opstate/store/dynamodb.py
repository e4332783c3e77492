"""The production store: one DynamoDB table, conditional writes on ``version``.

The item shape (``name`` is the partition key, a sparse GSI ``open-index`` keys the open
operations by shard and due time) and its codec live in ``dynamodb_items``; the client, its
retry policy and the fault mapping in ``dynamodb_client``. This module re-exports the public
names of both, so ``opstate.store.dynamodb`` stays the one import for callers.

Unsettled archives are found on the sparse GSI ``archive-index`` (see ``dynamodb_items``): a
``Query`` per queue shard, never a Scan, except once per process for the items the previous
releases wrote before the index existed (a filtered Scan that queues them), and while
DynamoDB is still building the index after the upgrade (the filtered Scan, as before).

A create is a full ``PutItem`` under ``attribute_not_exists(#name)``; a replace is an
``UpdateItem`` that sets every record attribute under ``#version = :expected`` (so the poll state
beside the record survives); both with ``ReturnValuesOnConditionCheckFailure=ALL_OLD``: a lost
write hands back the item that beat it, deserialised from the exception, never re-read.

Faults (throttling, 5xx, timeouts, connection errors, missing table or credentials) raise
``StoreUnavailableError``. A record whose details no store can hold is refused before the call,
and a ``ValidationException`` from a write (an item DynamoDB will never accept) raises
``RecordRejectedError``: both permanent, never retried. Other client errors are bugs and
propagate as ``ClientError``.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from opstate.config import DEFAULT_RETENTION_DAYS
from opstate.domain.model import OpRecord
from opstate.store.dynamodb_client import (
    CLIENT_CONFIG,
    CONDITION_FAILED,
    UNAVAILABLE_CODES,
    fault,
    is_unavailable,
    make_client,
    refused,
)
from opstate.store.dynamodb_items import (
    ARCHIVE_DONE,
    ARCHIVE_QUEUE_SHARDS,
    DEFAULT_SHARDS,
    OPTIONAL_RECORD_ATTRS,
    POLL_ATTRS,
    archive_from_item,
    archive_queue_of,
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
from opstate.store.port import (
    ARCHIVE_FAILED,
    ARCHIVE_PENDING,
    WRITTEN,
    ArchiveEntry,
    ArchiveState,
    Due,
    PollState,
    WriteOutcome,
    validate_record,
)

OPEN_INDEX = "open-index"
ARCHIVE_INDEX = "archive-index"
_NAMES = {"#name": "name"}
# The tables (endpoint, name) whose items of the previous releases this process has queued for
# their archives (``DynamoDBStore._queue_legacy``): once per process, not per call.
_LEGACY_QUEUED: set[tuple[str, str]] = set()
# Unsettled archives (the old way of finding them: a filtered Scan).
_UNSETTLED = (
    "attribute_exists(expires_at) AND (attribute_not_exists(archive_status) OR "
    "archive_status = :pending OR archive_status = :failed)"
)

__all__ = [
    "ARCHIVE_INDEX",
    "CLIENT_CONFIG",
    "DEFAULT_SHARDS",
    "OPEN_INDEX",
    "POLL_ATTRS",
    "UNAVAILABLE_CODES",
    "DynamoDBStore",
    "archive_from_item",
    "deserialize_item",
    "from_attr",
    "is_unavailable",
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
        self.client: Any = client if client is not None else make_client(endpoint_url)

    # -- the port ----------------------------------------------------------------------------

    def _item(self, name: str, **projection: Any) -> dict[str, Any] | None:
        """The item of ``name`` as stored (a consistent GetItem, wire format), or None;
        ``projection``: GetItem's ``ProjectionExpression`` / ``ExpressionAttributeNames``."""
        try:
            response = self.client.get_item(
                TableName=self.table_name,
                Key={"name": {"S": name}},
                ConsistentRead=True,
                **projection,
            )
        except (ClientError, BotoCoreError) as exc:
            fault(exc, "GetItem")
        item: dict[str, Any] | None = response.get("Item")
        return item or None

    def _update_if(self, name: str, **update: Any) -> bool:
        """A conditional UpdateItem of the item of ``name`` (``update``: its expressions):
        True when written, False when its condition failed; any other failure a store fault."""
        try:
            self.client.update_item(TableName=self.table_name, Key={"name": {"S": name}}, **update)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == CONDITION_FAILED:
                return False
            fault(exc, "UpdateItem")
        except BotoCoreError as exc:
            fault(exc, "UpdateItem")
        return True

    def get(self, name: str) -> OpRecord | None:
        item = self._item(name)
        return record_from_wire(item) if item else None

    def poll_state(self, name: str) -> PollState | None:
        """The poll state stored beside the record of ``name`` (consistent read), or None."""
        item = self._item(name)
        return poll_from_item(deserialize_item(item)) if item else None

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        return self._put(record, condition="attribute_not_exists(#name)", names=_NAMES, values=None)

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        validate_record(record)
        item = self.item(record)
        names: dict[str, str] = {"#version": "version"}
        values: dict[str, Any] = {":expected": {"N": str(expected_version)}}
        sets: list[str] = []
        for index, (key, value) in enumerate(sorted(item.items())):
            if key in ("name", "open_update_ns", "archive_queue", "archive_due_ns"):
                continue
            names[f"#a{index}"] = key
            values[f":a{index}"] = to_attr(value)
            sets.append(f"#a{index} = :a{index}")
        if "open_update_ns" in item:
            # Keep the due time the reconciler set; a lost operation (no key) rejoins, due now.
            names["#due"] = "open_update_ns"
            values[":due"] = to_attr(item["open_update_ns"])
            sets.append("#due = if_not_exists(#due, :due)")
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
        return self._conditional(
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
        """Open entries due by ``now_ns`` (None: all), oldest due first.

        One ascending ``Query`` per shard on ``open-index`` (``open_update_ns <= now``), merged
        lazily: a further page of a shard is read only when the caller gets that far. Never a
        Scan. GSI reads are eventually consistent: an entry may lag a write by a moment.
        """
        streams = [self._due_pages(shard, now_ns, page_size) for shard in range(self.shards)]
        yield from heapq.merge(*streams, key=lambda e: (e.poll.due_ns, e.record.name))

    def set_poll(self, name: str, version: int, poll: PollState) -> bool:
        fields: dict[str, int] = {
            "poll_misses": poll.misses,
            "poll_missing_since_ns": poll.missing_since_ns,
            "lost_ns": poll.lost_ns,
            "overdue_ns": poll.overdue_ns,
        }
        keep = set()
        if not poll.lost:
            fields["open_shard"] = shard_of(name, self.shards)
            fields["open_update_ns"] = max(0, poll.due_ns)
            keep = {"open_shard", "open_update_ns"}
        else:
            fields["open_shard"] = 0
            fields["open_update_ns"] = 0  # lost: out of the index
        names = {"#version": "version", "#expires": "expires_at"}
        values: dict[str, Any] = {":version": {"N": str(version)}}
        sets: list[str] = []
        removes: list[str] = []
        for index, (key, value) in enumerate(fields.items()):
            names[f"#p{index}"] = key
            if value or key in keep:
                values[f":p{index}"] = {"N": str(value)}
                sets.append(f"#p{index} = :p{index}")
            else:
                removes.append(f"#p{index}")
        if poll.progress is not None:
            names["#progress"] = "progress"
            values[":progress"] = to_attr(dict(poll.progress))
            sets.append("#progress = :progress")
        expression = ""
        if sets:
            expression = "SET " + ", ".join(sets)
        if removes:
            expression += " REMOVE " + ", ".join(removes)
        return self._update_if(
            name,
            UpdateExpression=expression.strip(),
            ConditionExpression="#version = :version AND attribute_not_exists(#expires)",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )

    def iter_marked(self) -> Iterator[Due]:
        """Open records that are lost or overdue (operator listing: a filtered Scan)."""
        for item in self._pages(
            "Scan",
            FilterExpression="attribute_not_exists(expires_at) AND "
            "(lost_ns > :zero OR overdue_ns > :zero)",
            ExpressionAttributeValues={":zero": {"N": "0"}},
        ):
            record = record_from_item(item)
            if not record.terminal:
                yield Due(record, poll_from_item(item))

    def get_archive(self, name: str) -> ArchiveState | None:
        item = self._item(
            name, ProjectionExpression="#archive", ExpressionAttributeNames={"#archive": "archive"}
        )
        return archive_from_item(deserialize_item(item)) if item else None

    def set_archive(self, name: str, expected_rev: int, state: ArchiveState) -> bool:
        """Write the archive state under its revision; an open one stays queued on
        ``archive-index`` (due at its ``due_ns``), a settled one leaves it."""
        stored = ArchiveState.from_dict({**state.as_dict(), "rev": expected_rev + 1})
        condition = "attribute_exists(#expires) AND #created = :created AND "
        values: dict[str, Any] = {
            ":archive": to_attr(stored.as_dict()),
            ":status": {"S": stored.status},
            ":rev": {"N": str(stored.rev)},
            ":queue": {"S": archive_queue_of(name) if stored.open else ARCHIVE_DONE},
            ":created": {"N": str(state.created_ns)},
        }
        if expected_rev:
            condition += "#rev = :expected"
            values[":expected"] = {"N": str(expected_rev)}
        else:
            condition += "attribute_not_exists(#rev)"
        expression = "SET #archive = :archive, #status = :status, #rev = :rev, #queue = :queue"
        if stored.open:
            expression += ", #due = :due"
            values[":due"] = {"N": str(stored.due_ns)}
        else:
            expression += " REMOVE #due"
        return self._update_if(
            name,
            UpdateExpression=expression,
            ConditionExpression=condition,
            ExpressionAttributeNames={
                "#archive": "archive",
                "#status": "archive_status",
                "#rev": "archive_rev",
                "#queue": "archive_queue",
                "#due": "archive_due_ns",
                "#expires": "expires_at",
                "#created": "created_ns",
            },
            ExpressionAttributeValues=values,
        )

    def get_progress(self, name: str) -> dict[str, int] | None:
        raw = (self._item(name, ProjectionExpression="progress") or {}).get("progress")
        value = plain(from_attr(raw)) if raw else None
        return value if isinstance(value, dict) else None

    def iter_archive_due(self, now_ns: int) -> Iterator[ArchiveEntry]:
        """Unsettled terminal records due by ``now_ns``, soonest due first (no state yet:
        due at once), ties by name: a Query per shard of ``archive-index`` (eventually
        consistent, as every GSI: a claim is a conditional write anyway), plus, once per
        process, the previous releases' items it queues. While DynamoDB still builds the index
        (just after the upgrade), the filtered Scan of every unsettled archive instead."""
        found = self._queue_legacy(now_ns)
        try:
            queued = [e for k in range(ARCHIVE_QUEUE_SHARDS) for e in self._queued(k, now_ns)]
        except _IndexNotReady:
            queued = [e for e in self._scan_unsettled() if _due(e, now_ns)]
        seen = {e.record.name for e in found}
        found += [e for e in queued if e.record.name not in seen]
        found.sort(key=lambda e: (e.archive.due_ns if e.archive else 0, e.record.name))
        yield from found

    def _queued(self, shard: int, now_ns: int) -> Iterator[ArchiveEntry]:
        """The due entries of one queue shard, in due order; a settled item still keyed there
        (a terminal record refreshed after its archive settled, by a release before the
        queue) leaves the queue instead."""
        items = self._pages(
            "Query",
            IndexName=ARCHIVE_INDEX,
            KeyConditionExpression="archive_queue = :queue AND archive_due_ns <= :now",
            ExpressionAttributeValues={
                ":queue": {"S": f"due#{shard}"},
                ":now": {"N": str(now_ns)},
            },
            ScanIndexForward=True,
        )
        try:
            for item in items:
                entry = ArchiveEntry(record_from_item(item), archive_from_item(item))
                if entry.archive is not None and not entry.archive.open:
                    self._unqueue(entry.record.name, entry.archive.rev)
                elif entry.record.terminal:
                    yield entry
        except ClientError as exc:  # what fault() raises for a refusal that is no fault
            if _building(exc):
                raise _IndexNotReady from exc
            raise

    def _queue_legacy(self, now_ns: int) -> list[ArchiveEntry]:
        """Once per process and table: the unsettled archives of items written before the
        queue (no ``archive_queue``) are queued (a conditional UpdateItem each: one written
        meanwhile by this release is left alone); the due ones are returned."""
        key = (str(getattr(self.client.meta, "endpoint_url", "")), self.table_name)
        if key in _LEGACY_QUEUED:
            return []
        due = []
        for entry in self._scan_unsettled(legacy=True):
            archive = entry.archive
            self._update_if(
                entry.record.name,
                UpdateExpression="SET #queue = :queue, #due = :due",
                ConditionExpression="attribute_exists(#expires) AND attribute_not_exists(#queue)",
                ExpressionAttributeNames={
                    "#queue": "archive_queue",
                    "#due": "archive_due_ns",
                    "#expires": "expires_at",
                },
                ExpressionAttributeValues={
                    ":queue": {"S": archive_queue_of(entry.record.name)},
                    ":due": {"N": str(archive.due_ns if archive is not None else 0)},
                },
            )
            if _due(entry, now_ns):
                due.append(entry)
        _LEGACY_QUEUED.add(key)
        return due

    def _scan_unsettled(self, *, legacy: bool = False) -> Iterator[ArchiveEntry]:
        """Every unsettled archive (``legacy``: only of items without ``archive_queue``): a
        filtered, consistent Scan of the whole table."""
        condition = _UNSETTLED + (" AND attribute_not_exists(archive_queue)" if legacy else "")
        for item in self._pages(
            "Scan",
            ConsistentRead=True,
            FilterExpression=condition,
            ExpressionAttributeValues={
                ":pending": {"S": ARCHIVE_PENDING},
                ":failed": {"S": ARCHIVE_FAILED},
            },
        ):
            yield ArchiveEntry(record_from_item(item), archive_from_item(item))

    def _unqueue(self, name: str, rev: int) -> None:
        self._update_if(
            name,
            UpdateExpression="SET #queue = :done REMOVE #due",
            ConditionExpression="#rev = :rev",
            ExpressionAttributeNames={
                "#queue": "archive_queue",
                "#due": "archive_due_ns",
                "#rev": "archive_rev",
            },
            ExpressionAttributeValues={":done": {"S": ARCHIVE_DONE}, ":rev": {"N": str(rev)}},
        )

    def iter_all(self) -> Iterator[OpRecord]:
        """Every record, in table order (operator listing only: a paginated, consistent Scan)."""
        for item in self._pages("Scan", ConsistentRead=True):
            yield record_from_item(item)

    def close(self) -> None:
        """Close the client's connections, if this store built the client (a client passed in
        belongs to the caller)."""
        close = getattr(self.client, "close", None)
        if self._owns_client and callable(close):
            close()

    # -- helpers -----------------------------------------------------------------------------

    def item(self, record: OpRecord) -> dict[str, Any]:
        """The python-valued item this store writes for ``record``."""
        return item_from_record(
            record, shards=self.shards, retention_days=self.retention_days, now_ns=self._clock()
        )

    def _put(
        self,
        record: OpRecord,
        *,
        condition: str,
        names: Mapping[str, str],
        values: Mapping[str, Any] | None,
    ) -> WriteOutcome:
        validate_record(record)
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "Item": serialize_item(self.item(record)),
            "ConditionExpression": condition,
            "ExpressionAttributeNames": dict(names),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if values:
            kwargs["ExpressionAttributeValues"] = dict(values)
        return self._conditional("PutItem", record, **kwargs)

    def _conditional(self, operation: str, record: OpRecord, **request: Any) -> WriteOutcome:
        """One conditional write (``PutItem`` or ``UpdateItem``): a failed condition is an
        outcome carrying the item that won; a refused item is ``RecordRejectedError``; anything
        else is a fault (``StoreUnavailableError`` when transient)."""
        call = self.client.put_item if operation == "PutItem" else self.client.update_item
        try:
            call(**request)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == CONDITION_FAILED:
                old: Any = exc.response.get("Item")
                return WriteOutcome(ok=False, current=record_from_wire(old) if old else None)
            refused(exc, record)
            fault(exc, operation)
        except BotoCoreError as exc:
            fault(exc, operation)
        return WRITTEN

    def _due_pages(self, shard: int, now_ns: int | None, page_size: int) -> Iterator[Due]:
        condition = "open_shard = :shard"
        values: dict[str, Any] = {":shard": {"N": str(shard)}}
        if now_ns is not None:
            condition += " AND open_update_ns <= :now"
            values[":now"] = {"N": str(now_ns)}
        for item in self._pages(
            "Query",
            IndexName=OPEN_INDEX,
            KeyConditionExpression=condition,
            ExpressionAttributeValues=values,
            ScanIndexForward=True,
            Limit=max(1, page_size),
        ):
            yield Due(record_from_item(item), poll_from_item(item))

    def _pages(self, operation: str, **request: Any) -> Iterator[dict[str, Any]]:
        """The items (deserialised) of a paginated ``Scan`` or ``Query`` of the table with
        ``request``, a page read only when the caller gets that far; a failed call is a fault
        (``fault``: ``StoreUnavailableError``, or the ``ClientError`` itself)."""
        call = self.client.scan if operation == "Scan" else self.client.query
        start: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {"TableName": self.table_name, **request}
            if start:
                kwargs["ExclusiveStartKey"] = start
            try:
                page = call(**kwargs)
            except (ClientError, BotoCoreError) as exc:
                fault(exc, operation)
            for raw in page.get("Items", []):
                yield deserialize_item(raw)
            start = page.get("LastEvaluatedKey")
            if not start:
                return


class _IndexNotReady(Exception):
    """``archive-index`` is still being built (the table was just upgraded)."""


def _building(exc: ClientError) -> bool:
    """A Query refused because the index is still backfilling (a ValidationException)."""
    error = exc.response.get("Error", {})
    return (
        error.get("Code") == "ValidationException"
        and "backfill" in str(error.get("Message", "")).lower()
    )


def _due(entry: ArchiveEntry, now_ns: int) -> bool:
    """No archive state yet (due at once), or open and due by ``now_ns``."""
    return entry.archive is None or (entry.archive.open and entry.archive.due_ns <= now_ns)
