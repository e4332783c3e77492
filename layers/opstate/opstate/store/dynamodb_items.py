"""The DynamoDB item of a record: the wire format codec and records <-> items (no boto3).

Item shape (``name`` is the partition key):

- ``name`` S, ``state`` S, ``rank`` N, ``update_ns`` N (server time, ns), ``update_time`` S
  (canonical RFC3339, absent when ``update_ns`` is 0), ``version`` N, ``kind`` S, ``source`` S,
  ``details`` M, ``created_ns``/``applied_ns`` N, ``created_at``/``applied_at`` S (canonical,
  absent when 0); ``details_bytes`` N (the details' compact JSON size, or an upper bound of it)
  and ``details_v`` N (the version it was written at: ``dynamodb_apply``'s one-call write trusts
  ``details_bytes`` only while ``details_v = version``; items of earlier releases lack both).
- While open (non-terminal) and not lost only: ``open_shard`` N (stable CRC-32 of the name mod
  ``shards``) and ``open_update_ns`` N. They key the sparse GSI ``open-index``; a terminal write
  (or marking the operation lost) drops both, so the operation leaves the index.
  ``open_update_ns`` is when the operation is next due for a poll (``PollState.due_ns``; the
  attribute keeps its first name because it is the index's key schema, which CloudFormation
  cannot change in place). The previous release wrote the update time there, which simply reads
  as "due since then": its items are polled like any other.
  Since issue 48 the key holds the due time rounded down to the hour (``open_key``:
  ``OPEN_BUCKET_NS``) and ``poll_due_ns`` N the due time itself (written with the key by
  ``set_poll``, removed with it; a new record's is its first due time, a replace keeps it or
  sets it only where absent): a reschedule within the hour updates the index entry in place
  (one index write) instead of moving its key (a delete and a put). An item whose
  ``poll_due_ns`` is absent or not in its key's hour (items of earlier releases, whose key is
  the due time itself) is due at its key.
- Poll state, written by the reconciler (``set_poll``), absent means 0: ``poll_misses`` N,
  ``poll_missing_since_ns`` N, ``lost_ns`` N, ``overdue_ns`` N. A replace keeps ``open_update_ns``
  and ``overdue_ns`` (it is an ``UpdateItem``), and clears the not-found streak and the lost
  mark: an applied write is a real observation.
- The archive state of a terminal record (``set_archive``, ``opstate.outcomes``): ``archive`` M
  (``ArchiveState.as_dict``) with copies for conditions and filters, ``archive_status`` S and
  ``archive_rev`` N; absent: none yet. A replace never touches them.
- The archive queue, the sparse GSI ``archive-index`` (``archive_queue`` S, ``archive_due_ns``
  N): a terminal record whose archive is not settled is keyed ``due#<k>`` (``k``: CRC-32 of the
  name mod ``ARCHIVE_QUEUE_SHARDS``, fixed) and its due time (0: none yet, due at once; else
  its status's ``due_ns``); a settled one has ``archive_queue`` ``done`` and no due time, so it
  is out of the index. A terminal write sets both only where ``archive_queue`` is absent
  (``if_not_exists``): becoming terminal queues the archive, refreshing a terminal record never
  re-queues a settled one. Items of the previous releases have no ``archive_queue``: the store
  finds them once per process by a filtered Scan and queues them (``DynamoDBStore``).
- The retry state of any record, open or terminal (``set_retry``, issue 33): ``retry`` M
  (``RetryState.as_dict``) with copies for conditions and the due listing, ``retry_status`` S,
  ``retry_rev`` N and ``retry_due_ns`` N; absent (items of earlier releases, records without a
  policy): none. A replace never touches them (``dynamodb_retries``).
- The retry queue, the sparse GSI ``retry-index`` (``retry_queue`` S, ``retry_due_ns`` N): an
  active retry root is keyed ``active#<k>`` (``k``: CRC-32 of the name mod
  ``RETRY_QUEUE_SHARDS``, fixed) and its due time; any other retry state has no
  ``retry_queue``, so it is out of the index. ``set_retry`` writes or removes it in the same
  UpdateItem.
- When terminal only: ``expires_at`` N (epoch seconds: applied time + ``retention_days``), the
  table's TTL attribute.

Numbers come back from DynamoDB as ``Decimal``; ``plain`` turns them into ``int`` / ``float``.
Pure: no AWS code here (``dynamodb`` re-exports every public name of this module).
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from opstate.config import DEFAULT_OPEN_INDEX_SHARDS, DEFAULT_RETENTION_DAYS
from opstate.domain.details import size as details_size
from opstate.domain.model import OpRecord
from opstate.domain.states import parse_state
from opstate.domain.times import format_time
from opstate.store.port import ArchiveState, PollState, expires_at, initial_due

if TYPE_CHECKING:  # loaded by the first retry read: the webhook's init never needs it
    from opstate.store.retry_state import RetryState

DEFAULT_SHARDS = DEFAULT_OPEN_INDEX_SHARDS
# The sparse GSIs (template.yaml names them the same): the open operations, the archive queue
# (and, below, the active retry roots).
OPEN_INDEX = "open-index"
ARCHIVE_INDEX = "archive-index"
# The archive queue's shards: fixed (a queue key is written once per archive, and changing the
# count would strand the keys written under the old one).
ARCHIVE_QUEUE_SHARDS = 4
ARCHIVE_DONE = "done"
# The sparse GSI of active retry roots (template.yaml names it the same) and its fixed shards.
RETRY_INDEX = "retry-index"
RETRY_QUEUE_SHARDS = 4

# The open-index key rounds the due time down to this (``open_key``).
OPEN_BUCKET_NS = 3600 * 1_000_000_000

# Attributes a record may lack (written only when non-zero / in some states).
OPTIONAL_RECORD_ATTRS = (
    "update_time",
    "created_at",
    "applied_at",
    "expires_at",
    "open_shard",
    "open_update_ns",
    "poll_due_ns",
)
# The poll state beside the record (absent means 0).
POLL_ATTRS = ("poll_misses", "poll_missing_since_ns", "lost_ns", "overdue_ns")


def shard_of(name: str, shards: int) -> int:
    """The open-index shard of ``name``: CRC-32 of its UTF-8 bytes mod ``shards`` (stable)."""
    return zlib.crc32(name.encode("utf-8")) % shards


def open_key(due_ns: int) -> int:
    """The ``open_update_ns`` of a due time: rounded down to ``OPEN_BUCKET_NS`` (0 and before
    the epoch: 0)."""
    due = max(0, due_ns)
    return due - due % OPEN_BUCKET_NS


def due_of(item: Mapping[str, Any]) -> int:
    """When an open item is due: ``poll_due_ns`` where it is in its key's hour (``set_poll``
    writes both), else the key itself (a new record, items of earlier releases)."""
    key = int(item.get("open_update_ns", 0))
    due = item.get("poll_due_ns")
    if due is not None and open_key(int(due)) == key:
        return int(due)
    return key


def archive_queue_of(name: str) -> str:
    """The ``archive_queue`` key of ``name`` while its archive is not settled."""
    return f"due#{shard_of(name, ARCHIVE_QUEUE_SHARDS)}"


def retry_queue_of(name: str) -> str:
    """The ``retry_queue`` key of ``name`` while its retry state is active."""
    return f"active#{shard_of(name, RETRY_QUEUE_SHARDS)}"


# ---------------------------------------------------------------------------------------------
# Python values <-> the DynamoDB low-level wire format ({"S": ...}, {"N": ...}, ...)


def _number_text(value: int | float | Decimal) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def to_attr(value: Any) -> dict[str, Any]:
    """One python value as a DynamoDB attribute value.

    JSON-shaped values map one to one (maps, lists, strings, numbers, booleans, null); floats are
    written through their shortest ``repr`` (exact); a non-finite float (NaN, ±Infinity, which
    DynamoDB cannot hold) is written as its text; anything else as its ``str()``.
    """
    scalar = _scalar_attr(value)
    if scalar is not None:
        return scalar
    if isinstance(value, Mapping):
        return {"M": {str(k): to_attr(v) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return {"L": [to_attr(v) for v in value]}
    if isinstance(value, set | frozenset):
        return {"L": [to_attr(v) for v in sorted(value, key=repr)]}
    return {"S": str(value)}


def _scalar_attr(value: Any) -> dict[str, Any] | None:
    """``value`` as an attribute value if it is null, a boolean, a number, text or bytes."""
    if value is None:
        return {"NULL": True}
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | Decimal):
        return {"N": _number_text(value)}
    if isinstance(value, float):
        if not math.isfinite(value):
            return {"S": repr(value).replace("inf", "Infinity").replace("nan", "NaN")}
        return {"N": _number_text(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, bytes | bytearray):
        return {"B": bytes(value)}
    return None


def _number(text: str) -> Decimal:
    return Decimal(text)


# Each attribute type's tag and how its raw value becomes a python value.
_FROM_ATTR: dict[str, Callable[[Any], Any]] = {
    "S": lambda raw: raw,
    "N": _number,
    "BOOL": bool,
    "NULL": lambda raw: None,
    "M": lambda raw: {k: from_attr(v) for k, v in raw.items()},
    "L": lambda raw: [from_attr(v) for v in raw],
    "B": bytes,
    "SS": set,
    "NS": lambda raw: {_number(v) for v in raw},
    "BS": lambda raw: {bytes(v) for v in raw},
}


def from_attr(attr: Mapping[str, Any]) -> Any:
    """One DynamoDB attribute value as a python value (numbers as ``Decimal``)."""
    ((tag, raw),) = attr.items()
    convert = _FROM_ATTR.get(tag)
    if convert is None:
        raise ValueError(f"unknown DynamoDB attribute type {tag!r}")
    return convert(raw)


def serialize_item(item: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {key: to_attr(value) for key, value in item.items()}


def deserialize_item(item: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A wire-format item (GetItem, a stream image) as python values, numbers as ``Decimal``."""
    return {key: from_attr(value) for key, value in item.items()}


def plain(value: Any) -> Any:
    """``Decimal`` numbers back to ``int`` (integral) or ``float``, through maps and lists."""
    if isinstance(value, Decimal):
        if value == value.to_integral_value():
            return int(value)
        return float(value)
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Records <-> items


def item_from_record(
    record: OpRecord,
    *,
    shards: int = DEFAULT_SHARDS,
    retention_days: int = DEFAULT_RETENTION_DAYS,
    now_ns: int | None = None,
) -> dict[str, Any]:
    """The item of ``record`` as python values (what a ``TypeSerializer`` would accept)."""
    item: dict[str, Any] = {
        "name": record.name,
        "state": str(record.state),
        "rank": record.rank,
        "update_ns": record.update_time_ns,
        "version": record.version,
        "kind": str(record.kind),
        "source": str(record.source),
        "details": dict(record.details),
        "created_ns": record.created_ns,
        "applied_ns": record.applied_ns,
        # The details' size and the version it was measured at (``dynamodb_apply``).
        "details_bytes": details_size(record.details),
        "details_v": record.version,
    }
    if record.update_time_ns:
        item["update_time"] = format_time(record.update_time_ns)
    if record.created_ns:
        item["created_at"] = format_time(record.created_ns)
    if record.applied_ns:
        item["applied_at"] = format_time(record.applied_ns)
    if record.terminal:
        item["expires_at"] = expires_at(
            record, retention_days, time.time_ns() if now_ns is None else now_ns
        )
        # Queued for its archive (a replace writes these only where absent).
        item["archive_queue"] = archive_queue_of(record.name)
        item["archive_due_ns"] = 0
    else:
        item["open_shard"] = shard_of(record.name, shards)
        item["open_update_ns"] = open_key(initial_due(record))
        item["poll_due_ns"] = max(0, initial_due(record))
    return item


def record_from_item(item: Mapping[str, Any]) -> OpRecord:
    """The record of a deserialised item (numbers as ``Decimal`` or ``int``).

    For a stream image, deserialise first (``deserialize_item``) or call ``record_from_wire``.
    """
    details = plain(item.get("details") or {})
    return OpRecord(
        name=str(item["name"]),
        state=parse_state(item["state"]),
        update_time_ns=int(item.get("update_ns", 0)),
        version=int(item["version"]),
        source=str(item.get("source", "")),
        details=details if isinstance(details, dict) else {},
        created_ns=int(item.get("created_ns", 0)),
        applied_ns=int(item.get("applied_ns", 0)),
    )


def poll_from_item(item: Mapping[str, Any]) -> PollState:
    """The poll state stored beside a record (deserialised item; absent attributes are 0; the
    stored progress, if any)."""

    def number(key: str) -> int:
        value = item.get(key)
        return int(value) if value is not None else 0

    return PollState(
        due_ns=due_of(item),
        misses=number("poll_misses"),
        missing_since_ns=number("poll_missing_since_ns"),
        lost_ns=number("lost_ns"),
        overdue_ns=number("overdue_ns"),
        progress=progress_from(item.get("progress")),
    )


def progress_from(value: object) -> dict[str, int] | None:
    """A stored batch progress (``PollState.progress``: a map of counts) as integers; None when
    there is none or it is not a map of numbers."""
    if not isinstance(value, Mapping):
        return None
    out: dict[str, int] = {}
    for key, count in value.items():
        if isinstance(count, bool) or not isinstance(count, int | float | Decimal):
            return None
        out[str(key)] = int(count)
    return out


def archive_from_item(item: Mapping[str, Any]) -> ArchiveState | None:
    """The archive state stored beside a record (deserialised item), or None."""
    raw = item.get("archive")
    if not isinstance(raw, Mapping):
        return None
    return ArchiveState.from_dict(plain(raw))


def retry_from_item(item: Mapping[str, Any]) -> RetryState | None:
    """The retry state stored beside a record (deserialised item), or None."""
    from opstate.store.retry_state import RetryState

    raw = item.get("retry")
    if not isinstance(raw, Mapping):
        return None
    return RetryState.from_dict(plain(raw))


def record_from_wire(item: Mapping[str, Mapping[str, Any]]) -> OpRecord:
    """The record of a wire-format item (``{"name": {"S": ...}, ...}``)."""
    return record_from_item(deserialize_item(item))
