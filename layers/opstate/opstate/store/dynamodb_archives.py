"""The archiver's side of ``DynamoDBStore``: the archive state of a terminal record and the
queue of unsettled archives, the sparse GSI ``archive-index`` (``dynamodb_items`` describes the
attributes).

Unsettled archives are found by a ``Query`` per queue shard, never a Scan, except once per
process for the items the previous releases wrote before the index existed (a filtered Scan
that queues them), and while DynamoDB is still building the index after the upgrade (the
filtered Scan, as before).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from botocore.exceptions import ClientError

from opstate.store.dynamodb_items import (
    ARCHIVE_DONE,
    ARCHIVE_INDEX,
    ARCHIVE_QUEUE_SHARDS,
    archive_from_item,
    archive_queue_of,
    deserialize_item,
    record_from_item,
    to_attr,
)
from opstate.store.dynamodb_table import Table
from opstate.store.port import ARCHIVE_FAILED, ARCHIVE_PENDING, ArchiveEntry, ArchiveState

# The tables (endpoint, name) whose items of the previous releases this process has queued for
# their archives (``_queue_legacy``): once per process, not per call.
_LEGACY_QUEUED: set[tuple[str, str]] = set()
# Unsettled archives (the old way of finding them: a filtered Scan).
_UNSETTLED = (
    "attribute_exists(expires_at) AND (attribute_not_exists(archive_status) OR "
    "archive_status = :pending OR archive_status = :failed)"
)


def get_archive(table: Table, name: str) -> ArchiveState | None:
    """The archive state of ``name`` (consistent read), or None."""
    item = table.get(
        name, ProjectionExpression="#archive", ExpressionAttributeNames={"#archive": "archive"}
    )
    return archive_from_item(deserialize_item(item)) if item else None


def set_archive(table: Table, name: str, expected_rev: int, state: ArchiveState) -> bool:
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
    return table.update_if(
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


def iter_archive_due(table: Table, now_ns: int) -> Iterator[ArchiveEntry]:
    """Unsettled terminal records due by ``now_ns``, soonest due first (no state yet: due at
    once), ties by name: a Query per shard of ``archive-index`` (eventually consistent, as every
    GSI: a claim is a conditional write anyway), plus, once per process, the previous releases'
    items it queues. While DynamoDB still builds the index (just after the upgrade), the
    filtered Scan of every unsettled archive instead."""
    found = _queue_legacy(table, now_ns)
    try:
        queued = [e for k in range(ARCHIVE_QUEUE_SHARDS) for e in _queued(table, k, now_ns)]
    except _IndexNotReady:
        queued = [e for e in _scan_unsettled(table) if _due(e, now_ns)]
    seen = {e.record.name for e in found}
    found += [e for e in queued if e.record.name not in seen]
    found.sort(key=lambda e: (e.archive.due_ns if e.archive else 0, e.record.name))
    yield from found


def _queued(table: Table, shard: int, now_ns: int) -> Iterator[ArchiveEntry]:
    """The due entries of one queue shard, in due order; a settled item still keyed there (a
    terminal record refreshed after its archive settled, by a release before the queue) leaves
    the queue instead."""
    items = table.pages(
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
                _unqueue(table, entry.record.name, entry.archive.rev)
            elif entry.record.terminal:
                yield entry
    except ClientError as exc:  # what fault() raises for a refusal that is no fault
        if _building(exc):
            raise _IndexNotReady from exc
        raise


def _queue_legacy(table: Table, now_ns: int) -> list[ArchiveEntry]:
    """Once per process and table: the unsettled archives of items written before the queue
    (no ``archive_queue``) are queued (a conditional UpdateItem each: one written meanwhile by
    this release is left alone); the due ones are returned."""
    key = (str(getattr(table.client.meta, "endpoint_url", "")), table.name)
    if key in _LEGACY_QUEUED:
        return []
    due = []
    for entry in _scan_unsettled(table, legacy=True):
        archive = entry.archive
        table.update_if(
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


def _scan_unsettled(table: Table, *, legacy: bool = False) -> Iterator[ArchiveEntry]:
    """Every unsettled archive (``legacy``: only of items without ``archive_queue``): a
    filtered, consistent Scan of the whole table."""
    condition = _UNSETTLED + (" AND attribute_not_exists(archive_queue)" if legacy else "")
    for item in table.pages(
        "Scan",
        ConsistentRead=True,
        FilterExpression=condition,
        ExpressionAttributeValues={
            ":pending": {"S": ARCHIVE_PENDING},
            ":failed": {"S": ARCHIVE_FAILED},
        },
    ):
        yield ArchiveEntry(record_from_item(item), archive_from_item(item))


def _unqueue(table: Table, name: str, rev: int) -> None:
    table.update_if(
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
