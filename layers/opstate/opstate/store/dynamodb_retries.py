"""The retry runner's side of ``DynamoDBStore`` (issue 33): the retry state beside any record,
open or terminal (``dynamodb_items`` describes the attributes: ``retry`` M and its copies
``retry_status`` S, ``retry_rev`` N, ``retry_due_ns`` N; absent on items of earlier releases).

``set_retry`` is its own conditional ``UpdateItem`` (the record exists, is the incarnation
``created_ns`` and its retry revision is still the expected one): it never touches the record's
attributes, its poll state or its archive. A replace by ingest sets only the record's
attributes, so it keeps these.

``iter_retry_due`` is a ``Query`` per shard of the sparse GSI ``retry-index`` (only active
roots carry its key ``retry_queue``; ``set_retry`` writes or removes it in the same UpdateItem),
never a Scan, since the reconciler and the archiver ask on every run. A table without the index
(one of the previous release before ``sam deploy`` adds it, or while DynamoDB still builds it)
gets the filtered, consistent Scan instead, for that call: the next call tries the index again.
Active items written before the index existed carry no ``retry_queue`` (only this unreleased
branch wrote them): nothing queues them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from botocore.exceptions import ClientError

from opstate.domain.model import OpRecord
from opstate.store.dynamodb_items import (
    RETRY_INDEX,
    RETRY_QUEUE_SHARDS,
    deserialize_item,
    record_from_item,
    retry_from_item,
    retry_queue_of,
    to_attr,
)
from opstate.store.dynamodb_table import Table
from opstate.store.port import RecordRejectedError, StoreUnavailableError, check_retry
from opstate.store.retry_state import RETRY_ACTIVE, RetryState

_NAMES = {
    "#name": "name",
    "#created": "created_ns",
    "#retry": "retry",
    "#status": "retry_status",
    "#rev": "retry_rev",
    "#due": "retry_due_ns",
    "#queue": "retry_queue",
}


def get_retry(table: Table, name: str) -> RetryState | None:
    """The retry state of ``name`` (consistent read), or None."""
    item = table.get(
        name, ProjectionExpression="#retry", ExpressionAttributeNames={"#retry": "retry"}
    )
    return retry_from_item(deserialize_item(item)) if item else None


def set_retry(table: Table, name: str, expected_rev: int, state: RetryState) -> bool:
    """Write ``state`` with ``rev = expected_rev + 1`` if the item of ``name`` exists, is the
    incarnation ``state.created_ns`` and its ``retry_rev`` is still ``expected_rev`` (0: absent,
    as on the items of earlier releases, or 0); an active state is queued on ``retry-index``
    (``retry_queue``), any other leaves it."""
    stored = RetryState.from_dict({**state.as_dict(), "rev": expected_rev + 1})
    check_retry(stored)  # refused before the call
    condition = "attribute_exists(#name) AND #created = :created AND "
    values: dict[str, Any] = {
        ":retry": to_attr(stored.as_dict()),
        ":status": {"S": stored.status},
        ":rev": {"N": str(stored.rev)},
        ":due": {"N": str(stored.due_ns)},
        ":created": {"N": str(state.created_ns)},
        ":expected": {"N": str(expected_rev)},
    }
    if expected_rev:
        condition += "#rev = :expected"
    else:
        condition += "(attribute_not_exists(#rev) OR #rev = :expected)"
    expression = "SET #retry = :retry, #status = :status, #rev = :rev, #due = :due"
    if stored.active:
        expression += ", #queue = :queue"
        values[":queue"] = {"S": retry_queue_of(name)}
    else:
        expression += " REMOVE #queue"
    try:
        return table.update_if(
            name,
            UpdateExpression=expression,
            ConditionExpression=condition,
            ExpressionAttributeNames=dict(_NAMES),
            ExpressionAttributeValues=values,
        )
    except ClientError as exc:  # what fault() raises for a refusal that is no fault
        error = exc.response.get("Error", {})
        if error.get("Code") == "ValidationException":  # e.g. the item would pass 400 KB
            message = error.get("Message", "")
            raise RecordRejectedError(
                f"DynamoDB refused the retry state of {name}: {message}"
            ) from exc
        raise


def iter_retry_due(table: Table, now_ns: int) -> Iterator[tuple[OpRecord, RetryState]]:
    """Active retry roots due by ``now_ns``, soonest due first, ties by name: a Query per shard
    of ``retry-index`` (eventually consistent, as every GSI: each write the runner makes is
    conditional on the revision it read, so a stale entry only loses its race), or, on a table
    without the index, the filtered Scan (see the module docstring)."""
    try:
        due = [pair for k in range(RETRY_QUEUE_SHARDS) for pair in _queued(table, k, now_ns)]
    except _NoIndex:
        due = list(_scan_due(table, now_ns))
    due.sort(key=lambda pair: (pair[1].due_ns, pair[0].name))
    yield from due


def _queued(table: Table, shard: int, now_ns: int) -> Iterator[tuple[OpRecord, RetryState]]:
    """The due active roots of one queue shard (the index projects every attribute)."""
    items = table.pages(
        "Query",
        IndexName=RETRY_INDEX,
        KeyConditionExpression="#queue = :queue AND #due <= :now",
        ExpressionAttributeNames={"#queue": "retry_queue", "#due": "retry_due_ns"},
        ExpressionAttributeValues={
            ":queue": {"S": f"active#{shard}"},
            ":now": {"N": str(now_ns)},
        },
        ScanIndexForward=True,
    )
    try:
        for item in items:
            yield from _due(item, now_ns)
    except (ClientError, StoreUnavailableError) as exc:
        if _missing_index(exc):
            raise _NoIndex from exc
        raise


def _scan_due(table: Table, now_ns: int) -> Iterator[tuple[OpRecord, RetryState]]:
    """The due active roots by a filtered, paged, consistent Scan of the whole table."""
    for item in table.pages(
        "Scan",
        ConsistentRead=True,
        FilterExpression="#status = :active AND #due <= :now",
        ExpressionAttributeNames={"#status": "retry_status", "#due": "retry_due_ns"},
        ExpressionAttributeValues={":active": {"S": RETRY_ACTIVE}, ":now": {"N": str(now_ns)}},
    ):
        yield from _due(item, now_ns)


def _due(item: dict[str, Any], now_ns: int) -> Iterator[tuple[OpRecord, RetryState]]:
    state = retry_from_item(item)
    if state is not None and state.active and state.due_ns <= now_ns:
        yield record_from_item(item), state


class _NoIndex(Exception):
    """The table has no ``retry-index`` yet, or DynamoDB is still building it."""


def _missing_index(exc: ClientError | StoreUnavailableError) -> bool:
    """A Query refused because the table has no usable ``retry-index``: DynamoDB's
    ValidationException (no such index, or one still backfilling), or moto's
    ResourceNotFoundException naming the index (which ``fault`` maps to a store fault)."""
    cause = exc if isinstance(exc, ClientError) else exc.__cause__
    if not isinstance(cause, ClientError):
        return False
    error = cause.response.get("Error", {})
    message = str(error.get("Message", "")).lower()
    if error.get("Code") == "ValidationException":
        return "specified index" in message or "backfill" in message
    return error.get("Code") == "ResourceNotFoundException" and RETRY_INDEX in message
