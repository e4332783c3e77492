"""The production store: one DynamoDB table, conditional writes on ``version``.

Item shape (``name`` is the partition key):

- ``name`` S, ``state`` S, ``rank`` N, ``update_ns`` N (server time, ns), ``update_time`` S
  (canonical RFC3339, absent when ``update_ns`` is 0), ``version`` N, ``kind`` S, ``source`` S,
  ``details`` M, ``created_ns``/``applied_ns`` N, ``created_at``/``applied_at`` S (canonical,
  absent when 0).
- While open (non-terminal) and not lost only: ``open_shard`` N (stable CRC-32 of the name mod
  ``shards``) and ``open_update_ns`` N. They key the sparse GSI ``open-index``; a terminal write
  (or marking the operation lost) drops both, so the operation leaves the index.
  ``open_update_ns`` is when the operation is next due for a poll (``PollState.due_ns``; the
  attribute keeps its first name because it is the index's key schema, which CloudFormation
  cannot change in place). The previous release wrote the update time there, which simply reads
  as "due since then": its items are polled like any other.
- Poll state, written by the reconciler (``set_poll``), absent means 0: ``poll_misses`` N,
  ``poll_missing_since_ns`` N, ``lost_ns`` N, ``overdue_ns`` N. A replace keeps ``open_update_ns``
  and ``overdue_ns`` (it is an ``UpdateItem``), and clears the not-found streak and the lost
  mark: an applied write is a real observation.
- When terminal only: ``expires_at`` N (epoch seconds: applied time + ``retention_days``), the
  table's TTL attribute.

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
import math
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any, NoReturn

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    CredentialRetrievalError,
    HTTPClientError,
    NoCredentialsError,
)

from opstate.config import DEFAULT_OPEN_INDEX_SHARDS, DEFAULT_RETENTION_DAYS
from opstate.model import OpRecord
from opstate.states import parse_state
from opstate.store.port import (
    WRITTEN,
    Due,
    PollState,
    RecordRejectedError,
    StoreUnavailableError,
    WriteOutcome,
    expires_at,
    initial_due,
    validate_record,
)
from opstate.times import format_time

OPEN_INDEX = "open-index"
DEFAULT_SHARDS = DEFAULT_OPEN_INDEX_SHARDS

# The retry policy of every client this module builds: standard mode (exponential backoff with
# jitter, retry quotas, retries throttling and transient errors), short timeouts so a webhook
# answers "retry later" well within its sender's timeout.
CLIENT_CONFIG = Config(
    retries={"mode": "standard", "total_max_attempts": 3},
    connect_timeout=2,
    read_timeout=5,
    max_pool_connections=32,
)

# Error codes that mean "the store is not available right now", not "this request is wrong".
UNAVAILABLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "LimitExceededException",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "RequestTimeout",
        "RequestTimeoutException",
        "TransactionConflictException",
        "TransactionInProgressException",
        "ResourceNotFoundException",
        "ResourceInUseException",
        "TableNotFoundException",
        "UnrecognizedClientException",
        "ExpiredTokenException",
        "AccessDeniedException",
        "InvalidSignatureException",
        "MissingAuthenticationTokenException",
    }
)

_CONDITION_FAILED = "ConditionalCheckFailedException"
_VALIDATION = "ValidationException"
# Attributes a record may lack (written only when non-zero / in some states).
_OPTIONAL_RECORD_ATTRS = (
    "update_time",
    "created_at",
    "applied_at",
    "expires_at",
    "open_shard",
    "open_update_ns",
)
# The poll state beside the record (absent means 0).
POLL_ATTRS = ("poll_misses", "poll_missing_since_ns", "lost_ns", "overdue_ns")
_NAMES = {"#name": "name"}


def _refused(exc: ClientError, record: OpRecord) -> None:
    """Raise ``RecordRejectedError`` if DynamoDB refused ``record``'s item itself
    (``ValidationException``: permanent, never retried); return otherwise."""
    if exc.response.get("Error", {}).get("Code") == _VALIDATION:
        message = exc.response.get("Error", {}).get("Message", "")
        raise RecordRejectedError(f"DynamoDB refused the item of {record.name}: {message}") from exc


def make_client(endpoint_url: str | None = None, config: Config | None = None) -> Any:
    """A low-level DynamoDB client with the standard retry mode.

    ``endpoint_url`` is passed only when given, so boto3 keeps honouring
    ``AWS_ENDPOINT_URL_DYNAMODB`` / ``AWS_ENDPOINT_URL`` (moto server, DynamoDB Local).
    """
    kwargs: dict[str, Any] = {"config": config or CLIENT_CONFIG}
    if endpoint_url is not None:
        kwargs["endpoint_url"] = endpoint_url
    return boto3.client("dynamodb", **kwargs)


def shard_of(name: str, shards: int) -> int:
    """The open-index shard of ``name``: CRC-32 of its UTF-8 bytes mod ``shards`` (stable)."""
    return zlib.crc32(name.encode("utf-8")) % shards


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
    else:
        item["open_shard"] = shard_of(record.name, shards)
        item["open_update_ns"] = max(0, initial_due(record))
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
    """The poll state stored beside a record (deserialised item; absent attributes are 0)."""

    def number(key: str) -> int:
        value = item.get(key)
        return int(value) if value is not None else 0

    return PollState(
        due_ns=number("open_update_ns"),
        misses=number("poll_misses"),
        missing_since_ns=number("poll_missing_since_ns"),
        lost_ns=number("lost_ns"),
        overdue_ns=number("overdue_ns"),
    )


def record_from_wire(item: Mapping[str, Mapping[str, Any]]) -> OpRecord:
    """The record of a wire-format item (``{"name": {"S": ...}, ...}``)."""
    return record_from_item(deserialize_item(item))


# ---------------------------------------------------------------------------------------------
# Faults


def is_unavailable(exc: BaseException) -> bool:
    """True for the faults that mean "try again later" (see ``UNAVAILABLE_CODES``)."""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return code in UNAVAILABLE_CODES or status >= 500
    return isinstance(
        exc, ConnectionError | HTTPClientError | NoCredentialsError | CredentialRetrievalError
    )


def _fault(exc: ClientError | BotoCoreError, action: str) -> NoReturn:
    """Raise ``StoreUnavailableError`` for a fault, or ``exc`` itself for a bug."""
    if is_unavailable(exc):
        raise StoreUnavailableError(f"DynamoDB {action} failed: {exc}") from exc
    raise exc


class DynamoDBStore:
    """The store port on one DynamoDB table (see the module docstring for the item shape)."""

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

    def get(self, name: str) -> OpRecord | None:
        try:
            response = self.client.get_item(
                TableName=self.table_name, Key={"name": {"S": name}}, ConsistentRead=True
            )
        except (ClientError, BotoCoreError) as exc:
            _fault(exc, "GetItem")
        item = response.get("Item")
        return record_from_wire(item) if item else None

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        return self._put(record, condition="attribute_not_exists(#name)", names=_NAMES, values=None)

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        validate_record(record)
        item = self.item(record)
        names: dict[str, str] = {"#version": "version"}
        values: dict[str, Any] = {":expected": {"N": str(expected_version)}}
        sets: list[str] = []
        for index, (key, value) in enumerate(sorted(item.items())):
            if key in ("name", "open_update_ns"):
                continue
            names[f"#a{index}"] = key
            values[f":a{index}"] = to_attr(value)
            sets.append(f"#a{index} = :a{index}")
        if "open_update_ns" in item:
            # Keep the due time the reconciler set; a lost operation (no key) rejoins, due now.
            names["#due"] = "open_update_ns"
            values[":due"] = to_attr(item["open_update_ns"])
            sets.append("#due = if_not_exists(#due, :due)")
        removes = [k for k in _OPTIONAL_RECORD_ATTRS if k not in item]
        removes += ["poll_misses", "poll_missing_since_ns", "lost_ns"]
        for index, key in enumerate(removes):
            names[f"#r{index}"] = key
        expression = "SET " + ", ".join(sets)
        expression += " REMOVE " + ", ".join(f"#r{i}" for i in range(len(removes)))
        try:
            self.client.update_item(
                TableName=self.table_name,
                Key={"name": {"S": record.name}},
                UpdateExpression=expression,
                ConditionExpression="#version = :expected",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == _CONDITION_FAILED:
                old: Any = exc.response.get("Item")
                return WriteOutcome(ok=False, current=record_from_wire(old) if old else None)
            _refused(exc, record)
            _fault(exc, "UpdateItem")
        except BotoCoreError as exc:
            _fault(exc, "UpdateItem")
        return WRITTEN

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
        expression = ""
        if sets:
            expression = "SET " + ", ".join(sets)
        if removes:
            expression += " REMOVE " + ", ".join(removes)
        try:
            self.client.update_item(
                TableName=self.table_name,
                Key={"name": {"S": name}},
                UpdateExpression=expression.strip(),
                ConditionExpression="#version = :version AND attribute_not_exists(#expires)",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == _CONDITION_FAILED:
                return False
            _fault(exc, "UpdateItem")
        except BotoCoreError as exc:
            _fault(exc, "UpdateItem")
        return True

    def iter_marked(self) -> Iterator[Due]:
        """Open records that are lost or overdue (operator listing: a filtered Scan)."""
        start: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self.table_name,
                "FilterExpression": "attribute_not_exists(expires_at) AND "
                "(lost_ns > :zero OR overdue_ns > :zero)",
                "ExpressionAttributeValues": {":zero": {"N": "0"}},
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            try:
                page = self.client.scan(**kwargs)
            except (ClientError, BotoCoreError) as exc:
                _fault(exc, "Scan")
            for raw in page.get("Items", []):
                item = deserialize_item(raw)
                record = record_from_item(item)
                if not record.terminal:
                    yield Due(record, poll_from_item(item))
            start = page.get("LastEvaluatedKey")
            if not start:
                return

    def iter_all(self) -> Iterator[OpRecord]:
        """Every record, in table order (operator listing only: a paginated, consistent Scan)."""
        start: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {"TableName": self.table_name, "ConsistentRead": True}
            if start:
                kwargs["ExclusiveStartKey"] = start
            try:
                page = self.client.scan(**kwargs)
            except (ClientError, BotoCoreError) as exc:
                _fault(exc, "Scan")
            for item in page.get("Items", []):
                yield record_from_wire(item)
            start = page.get("LastEvaluatedKey")
            if not start:
                return

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
        try:
            self.client.put_item(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == _CONDITION_FAILED:
                old: Any = exc.response.get("Item")
                return WriteOutcome(ok=False, current=record_from_wire(old) if old else None)
            _refused(exc, record)
            _fault(exc, "PutItem")
        except BotoCoreError as exc:
            _fault(exc, "PutItem")
        return WRITTEN

    def _due_pages(self, shard: int, now_ns: int | None, page_size: int) -> Iterator[Due]:
        start: dict[str, Any] | None = None
        condition = "open_shard = :shard"
        values: dict[str, Any] = {":shard": {"N": str(shard)}}
        if now_ns is not None:
            condition += " AND open_update_ns <= :now"
            values[":now"] = {"N": str(now_ns)}
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self.table_name,
                "IndexName": OPEN_INDEX,
                "KeyConditionExpression": condition,
                "ExpressionAttributeValues": values,
                "ScanIndexForward": True,
                "Limit": max(1, page_size),
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            try:
                page = self.client.query(**kwargs)
            except (ClientError, BotoCoreError) as exc:
                _fault(exc, "Query")
            for raw in page.get("Items", []):
                item = deserialize_item(raw)
                yield Due(record_from_item(item), poll_from_item(item))
            start = page.get("LastEvaluatedKey")
            if not start:
                return
