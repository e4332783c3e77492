"""The reconciler's side of ``DynamoDBStore``: the open operations on the sparse GSI
``open-index`` (keyed by ``open_shard`` and ``open_update_ns``, the due time rounded down to
the hour; ``poll_due_ns`` holds the due time) and the poll state stored beside each record
(``dynamodb_items`` describes the attributes).

Due operations are found by one ascending ``Query`` per shard, merged lazily; never a Scan,
except for the operator's listing of lost or overdue operations (``iter_marked``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

from opstate.store.dynamodb_items import (
    OPEN_INDEX,
    open_key,
    poll_from_item,
    record_from_item,
    shard_of,
    to_attr,
)
from opstate.store.dynamodb_table import Table
from opstate.store.port import Due, PollState


def iter_due(table: Table, shards: int, now_ns: int | None, page_size: int) -> Iterator[Due]:
    """Open entries due by ``now_ns`` (None: all), oldest due first (ties by name).

    One ascending ``Query`` per shard on ``open-index`` (``open_update_ns <= now``), merged
    lazily: a further page of a shard is read only when the caller gets that far. Never a
    Scan. GSI reads are eventually consistent: an entry may lag a write by a moment. The
    key is the hour of the due time: the current hour's entries not due yet are read and
    skipped (read units for keeping a reschedule within the hour one index write).
    """
    streams = [_due_pages(table, shard, now_ns, page_size) for shard in range(shards)]
    yield from heapq.merge(*streams, key=lambda e: (e.poll.due_ns, e.record.name))


def _due_pages(table: Table, shard: int, now_ns: int | None, page_size: int) -> Iterator[Due]:
    condition = "open_shard = :shard"
    values: dict[str, Any] = {":shard": {"N": str(shard)}}
    if now_ns is not None:
        condition += " AND open_update_ns <= :now"
        values[":now"] = {"N": str(now_ns)}
    held: list[Due] = []
    hour = -1
    for item in table.pages(
        "Query",
        IndexName=OPEN_INDEX,
        KeyConditionExpression=condition,
        ExpressionAttributeValues=values,
        ScanIndexForward=True,
        Limit=max(1, page_size),
    ):
        # Items come in key order; within an hour (an earlier release's key is any time in
        # it), by due time here.
        key = open_key(int(item["open_update_ns"]))
        if key != hour:
            yield from sorted(held, key=lambda e: (e.poll.due_ns, e.record.name))
            held, hour = [], key
        due = Due(record_from_item(item), poll_from_item(item))
        if now_ns is None or due.poll.due_ns <= now_ns:
            held.append(due)
    yield from sorted(held, key=lambda e: (e.poll.due_ns, e.record.name))


def set_poll(table: Table, shards: int, name: str, version: int, poll: PollState) -> bool:
    """Write ``poll`` beside the record of ``name`` if it is still at ``version`` and open:
    due again at ``poll.due_ns`` on ``open-index``, or out of the index when lost."""
    fields: dict[str, int] = {
        "poll_misses": poll.misses,
        "poll_missing_since_ns": poll.missing_since_ns,
        "lost_ns": poll.lost_ns,
        "overdue_ns": poll.overdue_ns,
    }
    keep = set()
    if not poll.lost:
        # The key moves only when the due time leaves its hour (``open_key``).
        fields["open_shard"] = shard_of(name, shards)
        fields["open_update_ns"] = open_key(poll.due_ns)
        fields["poll_due_ns"] = max(0, poll.due_ns)
        keep = {"open_shard", "open_update_ns", "poll_due_ns"}
    else:
        fields["open_shard"] = 0
        fields["open_update_ns"] = 0  # lost: out of the index
        fields["poll_due_ns"] = 0
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
    return table.update_if(
        name,
        UpdateExpression=expression.strip(),
        ConditionExpression="#version = :version AND attribute_not_exists(#expires)",
        ExpressionAttributeNames=names,
        ExpressionAttributeValues=values,
    )


def iter_marked(table: Table) -> Iterator[Due]:
    """Open records that are lost or overdue (operator listing: a filtered Scan)."""
    for item in table.pages(
        "Scan",
        FilterExpression="attribute_not_exists(expires_at) AND "
        "(lost_ns > :zero OR overdue_ns > :zero)",
        ExpressionAttributeValues={":zero": {"N": "0"}},
    ):
        record = record_from_item(item)
        if not record.terminal:
            yield Due(record, poll_from_item(item))
