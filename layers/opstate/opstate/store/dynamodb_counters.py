"""The counters of ``DynamoDBStore`` (``store.counters``): an item of the operations table
named ``RESERVED_PREFIX + counter`` holding ``value``, added to by one conditional
``UpdateItem`` (``ADD``, on condition that the value before leaves room for the amount):
atomic, so runners adding at once never pass the cap together."""

from __future__ import annotations

from opstate.store.counters import RESERVED_PREFIX
from opstate.store.dynamodb_table import Table


def add_counter(table: Table, counter: str, amount: int, cap: int) -> bool:
    if amount < 0:
        raise ValueError("a counter is only added to")
    if amount > cap:
        return False
    return table.update_if(
        RESERVED_PREFIX + counter,
        UpdateExpression="ADD #value :amount",
        ConditionExpression="attribute_not_exists(#value) OR #value <= :room",
        ExpressionAttributeNames={"#value": "value"},
        ExpressionAttributeValues={
            ":amount": {"N": str(amount)},
            ":room": {"N": str(cap - amount)},
        },
    )


def get_counter(table: Table, counter: str) -> int:
    item = table.get(
        RESERVED_PREFIX + counter,
        ProjectionExpression="#value",
        ExpressionAttributeNames={"#value": "value"},
    )
    raw = (item or {}).get("value", {}).get("N")
    return int(raw) if raw is not None else 0
