"""One write per applied event: the reducer's rule in an ``UpdateItem``'s condition (pure).

``apply_request`` builds a conditional ``UpdateItem`` that writes ``event`` onto the stored
record without reading it first. Its condition holds exactly when ``reducer.apply_event``
would apply the event to the stored record *and* the expression below writes the record the
reducer would: so the write and the reducer agree, and whenever they might not, the condition
fails and the item comes back (``ReturnValuesOnConditionCheckFailure=ALL_OLD``) for the
ordinary read-reduce-write (``ingest``). A successful write hands back the old item
(``ReturnValues=ALL_OLD``) so that ``ingest`` reduces against it to name the decision.

The condition, for an event of rank ``r`` and server time ``t`` (the reducer, clause by clause):

- the record exists and ``details_v = version`` (its ``details_bytes`` was written by a writer
  that knew the details: this release; a previous release's write leaves ``details_v`` behind,
  so its records take the read path until a write of this release catches up);
- non-terminal event: ``rank < r OR (rank = r AND update_ns < t)`` (a terminal record has the
  top rank, so it is never regressed); terminal event: ``rank < r OR (state = s AND
  update_ns < t)`` (a different terminal state is a conflict, never applied);
- ``details_bytes <= MAX_DETAILS_BYTES - size(incoming) + 1``: the merged details
  (carried keys less the scoped ones, then the event's) are at most the two sizes less a pair
  of braces plus a comma, so the reducer's ``fit`` drops nothing;
- the state changes, or the record has none of ``STATE_SCOPED_KEYS`` the event does not carry:
  the write removes those keys (the reducer does on a state change; on a refresh removing
  absent keys is no change).

The expression sets what the reducer's next record holds: the event's state, rank, time
(``update_time``, removed when 0) and source; ``version + 1``; the event's details key by key
(``details.#k``), less the observation- and state-scoped keys it does not carry; the applied
time; ``created_ns`` / ``created_at`` untouched; the index keys as ``replace_if_version`` writes
them (``open_shard`` and, only where absent, ``open_update_ns`` and ``poll_due_ns``; terminal:
``expires_at`` and, only where absent, the archive queue); the poll streak and lost mark cleared; in
``details_bytes`` an upper bound of the new details' size (the merge is at most
``details_bytes + size(incoming) - 1``), and ``details_v`` the new version.

An event with more than ``MAX_KEYS`` detail keys is not written this way (None): the
expression would grow past DynamoDB's 4 KB.
"""

from __future__ import annotations

from typing import Any

from opstate.domain import details as details_rules
from opstate.domain.details import OBSERVATION_SCOPED_KEYS, STATE_SCOPED_KEYS
from opstate.domain.model import OpEvent, OpRecord
from opstate.store.dynamodb_items import item_from_record, to_attr

# Detail keys one blind write sets at most (each a name and a value in the expression).
MAX_KEYS = 24
# Attributes the blind write never sets from the event's record: kept, or computed below.
_NOT_SET = frozenset(
    {
        "name",
        "kind",  # the name's, written with the item
        "version",
        "details",
        "created_ns",
        "created_at",
        "details_bytes",
        "details_v",
        "open_update_ns",
        "poll_due_ns",
        "archive_queue",
        "archive_due_ns",
    }
)
_IF_ABSENT = ("open_update_ns", "poll_due_ns", "archive_queue", "archive_due_ns")
# What an applied write removes when the record it writes does not hold it.
_REMOVABLE = (
    "update_time",
    "applied_at",
    "expires_at",
    "open_shard",
    "open_update_ns",
    "poll_due_ns",
)
_CLEARED = ("poll_misses", "poll_missing_since_ns", "lost_ns")


def apply_request(
    event: OpEvent,
    now_ns: int,
    *,
    shards: int,
    retention_days: int,
) -> dict[str, Any] | None:
    """The ``UpdateItem`` arguments (less ``TableName``) that write ``event`` in one call, or
    None when this event cannot be written that way (too many detail keys)."""
    incoming, _ = details_rules.sanitize(event.details)
    if len(incoming) > MAX_KEYS:
        return None
    # The record the reducer would write, less what depends on the stored one.
    shape = OpRecord(
        name=event.name,
        state=event.state,
        update_time_ns=event.update_time_ns,
        version=1,
        source=event.source,
        details={},
        created_ns=0,
        applied_ns=now_ns,
    )
    item = item_from_record(shape, shards=shards, retention_days=retention_days, now_ns=now_ns)
    names: dict[str, str] = {
        "#version": "version",
        "#details": "details",
        "#db": "details_bytes",
        "#dv": "details_v",
        "#rank": "rank",
        "#state": "state",
        "#uns": "update_ns",
    }
    values: dict[str, Any] = {
        ":one": {"N": "1"},
        ":rank": {"N": str(shape.rank)},
        ":state": {"S": str(event.state)},
        ":ns": {"N": str(event.update_time_ns)},
        ":room": {"N": str(details_rules.MAX_DETAILS_BYTES - details_rules.size(incoming) + 1)},
        ":grow": {"N": str(details_rules.size(incoming) - 1)},
    }
    sets = ["#version = #version + :one", "#dv = #version + :one", "#db = #db + :grow"]
    for index, key in enumerate(sorted(k for k in item if k not in _NOT_SET)):
        names[f"#a{index}"] = key
        values[f":a{index}"] = to_attr(item[key])
        sets.append(f"#a{index} = :a{index}")
    for index, key in enumerate(k for k in _IF_ABSENT if k in item):
        names[f"#i{index}"] = key
        values[f":i{index}"] = to_attr(item[key])
        sets.append(f"#i{index} = if_not_exists(#i{index}, :i{index})")
    for index, (key, value) in enumerate(sorted(incoming.items())):
        names[f"#d{index}"] = key
        values[f":d{index}"] = to_attr(value)
        sets.append(f"#details.#d{index} = :d{index}")
    removes = [k for k in (*_REMOVABLE, *_CLEARED) if k not in item]
    names.update({f"#r{i}": key for i, key in enumerate(removes)})
    remove_paths = [f"#r{i}" for i in range(len(removes))]
    scoped = sorted((OBSERVATION_SCOPED_KEYS | STATE_SCOPED_KEYS) - incoming.keys())
    kept_on_refresh: list[str] = []
    for index, key in enumerate(scoped):
        names[f"#s{index}"] = key
        remove_paths.append(f"#details.#s{index}")
        if key in STATE_SCOPED_KEYS:
            kept_on_refresh.append(f"attribute_not_exists(#details.#s{index})")
    condition = [
        "#dv = #version",
        "#db <= :room",
        _monotone(shape.terminal),
    ]
    if kept_on_refresh:
        condition.append("(#state <> :state OR (" + " AND ".join(kept_on_refresh) + "))")
    return {
        "Key": {"name": {"S": event.name}},
        "UpdateExpression": "SET " + ", ".join(sets) + " REMOVE " + ", ".join(remove_paths),
        "ConditionExpression": " AND ".join(condition),
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
        "ReturnValues": "ALL_OLD",
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }


def _monotone(terminal: bool) -> str:
    """The reducer's order in a condition: a higher rank, or the same rank (for a terminal
    event: the same state) and a strictly newer server time."""
    if terminal:
        return "(#rank < :rank OR (#state = :state AND #uns < :ns))"
    return "(#rank < :rank OR (#rank = :rank AND #uns < :ns))"
