"""Waiters in a DynamoDB table of their own (partition key ``name``, sort key ``waiter_id``).

Why not attributes beside the record: the record's writes replace it under its ``version``
condition (a waiter would have to be carried through every ingest write or be lost), every
change of the item goes down the table's stream to the notifier, and the record's item and its
TTL belong to the record. A table of its own changes no record, version, stream record or
idempotency key, has its own TTL and its own stream (the resumer's "registered" trigger).

The bound: a counter item (``waiter_id`` ``#count``, attribute ``n``) is moved in the same
transaction as each waiter's put (``n < limit``) and delete, so concurrent registrations cannot
exceed it. Items carry ``expires_at`` (TTL, a year after registration: no Step Functions task
waits longer), the counter the latest of its waiters'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from botocore.exceptions import BotoCoreError, ClientError

from opstate.domain.times import NS_PER_SECOND
from opstate.store.dynamodb_client import is_unavailable, make_client
from opstate.waiters.model import COUNTER_ID, Target, Waiter, When
from opstate.waiters.port import TooManyWaitersError, WaiterStoreUnavailableError

TTL_SECONDS = 366 * 86_400
_CANCELLED = "TransactionCanceledException"


class DynamoDBWaiterStore:
    """The waiter store on one DynamoDB table (see the module docstring)."""

    def __init__(self, table_name: str, *, client: Any = None) -> None:
        self.table_name = table_name
        self.client: Any = client if client is not None else make_client()

    def _key(self, name: str, waiter_id: str) -> dict[str, Any]:
        return {"name": {"S": name}, "waiter_id": {"S": waiter_id}}

    def add(self, waiter: Waiter, limit: int) -> bool:
        expires = str(waiter.created_ns // NS_PER_SECOND + TTL_SECONDS)
        item = {
            **self._key(waiter.name, waiter.waiter_id),
            "target": {"S": str(waiter.target)},
            "token": {"S": waiter.token},
            "condition": {"S": str(waiter.when)},
            "created_ns": {"N": str(waiter.created_ns)},
            "expires_at": {"N": expires},
        }
        put = {
            "TableName": self.table_name,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(waiter_id)",
        }
        bump = {
            "TableName": self.table_name,
            "Key": self._key(waiter.name, COUNTER_ID),
            "UpdateExpression": "ADD n :one SET expires_at = :e",
            "ConditionExpression": "attribute_not_exists(n) OR n < :limit",
            "ExpressionAttributeValues": {
                ":one": {"N": "1"},
                ":limit": {"N": str(limit)},
                ":e": {"N": expires},
            },
        }
        try:
            self.client.transact_write_items(TransactItems=[{"Put": put}, {"Update": bump}])
        except ClientError as exc:
            return self._refused_add(exc, waiter)
        except BotoCoreError as exc:
            raise WaiterStoreUnavailableError(f"DynamoDB waiters: {exc}") from exc
        return True

    def _refused_add(self, exc: ClientError, waiter: Waiter) -> bool:
        if exc.response.get("Error", {}).get("Code") != _CANCELLED:
            self._fault(exc)
        codes = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
        if codes and codes[0] == "ConditionalCheckFailed":
            return False  # this waiter is already kept
        if len(codes) > 1 and codes[1] == "ConditionalCheckFailed":
            raise TooManyWaitersError(f"{waiter.name} already has its most waiters") from None
        return self._fault(exc)

    def _fault(self, exc: ClientError) -> NoReturn:
        if is_unavailable(exc) or exc.response.get("Error", {}).get("Code") == _CANCELLED:
            raise WaiterStoreUnavailableError(f"DynamoDB waiters: {exc}") from exc
        raise exc

    def list(self, name: str) -> Sequence[Waiter]:
        waiters: list[Waiter] = []
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "#n = :n",
            "ExpressionAttributeNames": {"#n": "name"},
            "ExpressionAttributeValues": {":n": {"S": name}},
            "ConsistentRead": True,
        }
        while True:
            try:
                page = self.client.query(**request)
            except ClientError as exc:
                self._fault(exc)
            except BotoCoreError as exc:
                raise WaiterStoreUnavailableError(f"DynamoDB waiters: {exc}") from exc
            waiters.extend(_waiter(i) for i in page.get("Items", ()) if _is_waiter(i))
            if "LastEvaluatedKey" not in page:
                break
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return sorted(waiters, key=lambda w: (w.created_ns, w.waiter_id))

    def remove(self, name: str, waiter_id: str) -> None:
        drop = {
            "TableName": self.table_name,
            "Key": self._key(name, waiter_id),
            "ConditionExpression": "attribute_exists(waiter_id)",
        }
        down = {
            "TableName": self.table_name,
            "Key": self._key(name, COUNTER_ID),
            "UpdateExpression": "ADD n :minus",
            "ExpressionAttributeValues": {":minus": {"N": "-1"}},
        }
        try:
            self.client.transact_write_items(TransactItems=[{"Delete": drop}, {"Update": down}])
        except ClientError as exc:
            codes = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
            if codes and codes[0] == "ConditionalCheckFailed":
                return  # already gone
            self._fault(exc)
        except BotoCoreError as exc:
            raise WaiterStoreUnavailableError(f"DynamoDB waiters: {exc}") from exc

    def close(self) -> None:
        return None


def _is_waiter(item: dict[str, Any]) -> bool:
    return item.get("waiter_id", {}).get("S") != COUNTER_ID and "token" in item


def _waiter(item: dict[str, Any]) -> Waiter:
    return Waiter(
        name=item["name"]["S"],
        target=Target(item["target"]["S"]),
        token=item["token"]["S"],
        when=When(item["condition"]["S"]),
        created_ns=int(item["created_ns"]["N"]),
    )
