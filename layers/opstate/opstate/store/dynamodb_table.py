"""One DynamoDB table through one client: the calls every part of ``DynamoDBStore`` makes.

A consistent ``GetItem``, a conditional ``UpdateItem`` (True / False), a conditional write of a
record that hands back the item that beat it, and the paginated ``Scan`` / ``Query``; each
failure mapped as ``dynamodb_client`` says (``StoreUnavailableError`` for a fault,
``RecordRejectedError`` for an item DynamoDB refuses, the ``ClientError`` itself for a bug).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from opstate.domain.model import OpRecord
from opstate.store.dynamodb_client import CONDITION_FAILED, fault, refused
from opstate.store.dynamodb_items import deserialize_item, record_from_wire
from opstate.store.port import WRITTEN, StoreUnavailableError, WriteOutcome


class Table:
    """The table ``name`` read and written through ``client`` (a low-level DynamoDB client)."""

    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.name = name

    def get(self, key: str, **projection: Any) -> dict[str, Any] | None:
        """The item of ``key`` as stored (a consistent GetItem, wire format), or None;
        ``projection``: GetItem's ``ProjectionExpression`` / ``ExpressionAttributeNames``."""
        try:
            response = self.client.get_item(
                TableName=self.name,
                Key={"name": {"S": key}},
                ConsistentRead=True,
                **projection,
            )
        except (ClientError, BotoCoreError) as exc:
            fault(exc, "GetItem")
        item: dict[str, Any] | None = response.get("Item")
        return item or None

    def get_batch(
        self, keys: Sequence[str], *, attempts: int = 4, sleep: Callable[[float], None] = time.sleep
    ) -> list[dict[str, Any]]:
        """The items of ``keys`` that exist (an eventually consistent ``BatchGetItem``: half
        the read units of a consistent one; wire format), 100 keys a call; ``UnprocessedKeys``
        asked again up to ``attempts`` calls a chunk, with a short growing pause, then a fault
        (``StoreUnavailableError``): never a silent partial read."""
        found: list[dict[str, Any]] = []
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 100):
            request: dict[str, Any] = {
                self.name: {
                    "Keys": [{"name": {"S": key}} for key in unique[start : start + 100]],
                    "ConsistentRead": False,
                }
            }
            for attempt in range(attempts):
                try:
                    response = self.client.batch_get_item(RequestItems=request)
                except (ClientError, BotoCoreError) as exc:
                    fault(exc, "BatchGetItem")
                found.extend(response.get("Responses", {}).get(self.name, []))
                request = response.get("UnprocessedKeys") or {}
                if not request:
                    break
                if attempt + 1 < attempts:
                    sleep(0.05 * 2**attempt)
            if request:
                raise StoreUnavailableError(
                    f"BatchGetItem on {self.name}: keys left unprocessed after {attempts} calls"
                )
        return found

    def update_if(self, key: str, **update: Any) -> bool:
        """A conditional UpdateItem of the item of ``key`` (``update``: its expressions):
        True when written, False when its condition failed; any other failure a store fault."""
        try:
            self.client.update_item(TableName=self.name, Key={"name": {"S": key}}, **update)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == CONDITION_FAILED:
                return False
            fault(exc, "UpdateItem")
        except BotoCoreError as exc:
            fault(exc, "UpdateItem")
        return True

    def write(self, operation: str, record: OpRecord, **request: Any) -> WriteOutcome:
        """One conditional write of ``record`` (``PutItem`` or ``UpdateItem``): a failed
        condition is an outcome carrying the item that won; a refused item is
        ``RecordRejectedError``; anything else is a fault (``StoreUnavailableError`` when
        transient)."""
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

    def update_returning(self, record: OpRecord, **request: Any) -> WriteOutcome:
        """A conditional UpdateItem that asks for the old item either way (``ReturnValues`` and
        ``ReturnValuesOnConditionCheckFailure`` ``ALL_OLD``): ``ok`` with the record it
        replaced (None: there was none), or not written with the stored record (None: no
        item). Refused and failed calls as ``write``."""
        try:
            response = self.client.update_item(TableName=self.name, **request)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == CONDITION_FAILED:
                old: Any = exc.response.get("Item")
                return WriteOutcome(ok=False, current=record_from_wire(old) if old else None)
            refused(exc, record)
            fault(exc, "UpdateItem")
        except BotoCoreError as exc:
            fault(exc, "UpdateItem")
        before: Any = response.get("Attributes")
        return WriteOutcome(ok=True, current=record_from_wire(before) if before else None)

    def pages(self, operation: str, **request: Any) -> Iterator[dict[str, Any]]:
        """The items (deserialised) of a paginated ``Scan`` or ``Query`` of the table with
        ``request``, a page read only when the caller gets that far; a failed call is a fault
        (``fault``: ``StoreUnavailableError``, or the ``ClientError`` itself)."""
        call = self.client.scan if operation == "Scan" else self.client.query
        start: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {"TableName": self.name, **request}
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
