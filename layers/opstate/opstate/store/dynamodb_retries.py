"""The retry runner's side of ``DynamoDBStore`` (issue 33): the retry state beside any record,
open or terminal (``dynamodb_items`` describes the attributes: ``retry`` M and its copies
``retry_status`` S, ``retry_rev`` N, ``retry_due_ns`` N; absent on items of earlier releases).

``set_retry`` is its own conditional ``UpdateItem`` (the record exists, is the incarnation
``created_ns`` and its retry revision is still the expected one): it never touches the record's
attributes, its poll state or its archive. A replace by ingest sets only the record's
attributes, so it keeps these.

``iter_retry_due`` is a filtered, paged, consistent **Scan** of the whole table (no index):
the retry runner calls it once per archive pass, and active roots are few; a GSI would cost a
write on every retry state for a listing that runs once per pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from botocore.exceptions import ClientError

from opstate.domain.model import OpRecord
from opstate.store.dynamodb_items import (
    deserialize_item,
    record_from_item,
    retry_from_item,
    to_attr,
)
from opstate.store.dynamodb_table import Table
from opstate.store.port import RecordRejectedError, check_retry
from opstate.store.retry_state import RETRY_ACTIVE, RetryState

_NAMES = {
    "#name": "name",
    "#created": "created_ns",
    "#retry": "retry",
    "#status": "retry_status",
    "#rev": "retry_rev",
    "#due": "retry_due_ns",
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
    as on the items of earlier releases, or 0)."""
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
    try:
        return table.update_if(
            name,
            UpdateExpression="SET #retry = :retry, #status = :status, #rev = :rev, #due = :due",
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
    """Active retry roots due by ``now_ns``, soonest due first, ties by name: a filtered,
    paged, consistent Scan (see the module docstring), sorted once it is read."""
    due: list[tuple[OpRecord, RetryState]] = []
    for item in table.pages(
        "Scan",
        ConsistentRead=True,
        FilterExpression="#status = :active AND #due <= :now",
        ExpressionAttributeNames={"#status": "retry_status", "#due": "retry_due_ns"},
        ExpressionAttributeValues={":active": {"S": RETRY_ACTIVE}, ":now": {"N": str(now_ns)}},
    ):
        state = retry_from_item(item)
        if state is not None and state.active and state.due_ns <= now_ns:
            due.append((record_from_item(item), state))
    due.sort(key=lambda pair: (pair[1].due_ns, pair[0].name))
    yield from due
