"""The production store: one DynamoDB table, conditional writes on ``version``.

Item shape (``name`` is the partition key):

- ``name`` S, ``state`` S, ``rank`` N, ``update_ns`` N (server time, ns), ``update_time`` S
  (canonical RFC3339, absent when ``update_ns`` is 0), ``version`` N, ``kind`` S, ``source`` S,
  ``details`` M, ``created_ns``/``applied_ns`` N, ``created_at``/``applied_at`` S (canonical,
  absent when 0).
- While open (non-terminal) only: ``open_shard`` N (stable CRC-32 of the name mod ``shards``) and
  ``open_update_ns`` N. They key the sparse GSI ``open-index``; a terminal write drops both, so
  the operation leaves the index.
- When terminal only: ``expires_at`` N (epoch seconds: applied time + ``retention_days``), the
  table's TTL attribute.

Every write is a full ``PutItem`` under a condition (``attribute_not_exists(#name)`` to create,
``#version = :expected`` to replace) with ``ReturnValuesOnConditionCheckFailure=ALL_OLD``: a lost
write hands back the item that beat it, deserialised from the exception, never re-read.

Faults (throttling, 5xx, timeouts, connection errors, missing table or credentials) raise
``StoreUnavailableError``. A record whose details no store can hold is refused before the call,
and a ``ValidationException`` from a write (an item DynamoDB will never accept) raises
``RecordRejectedError``: both permanent, never retried. Other client errors are bugs and
propagate as ``ClientError``.
"""

from __future__ import annotations

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

from opstate.reducer import OpRecord
from opstate.states import parse_state
from opstate.store.port import (
    WRITTEN,
    RecordRejectedError,
    StoreUnavailableError,
    WriteOutcome,
    validate_record,
)
from opstate.times import NS_PER_SECOND, format_time

OPEN_INDEX = "open-index"
DEFAULT_SHARDS = 4
DEFAULT_RETENTION_DAYS = 90
SECONDS_PER_DAY = 86_400

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
_NAMES = {"#name": "name"}


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
    if isinstance(value, Mapping):
        return {"M": {str(k): to_attr(v) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return {"L": [to_attr(v) for v in value]}
    if isinstance(value, set | frozenset):
        return {"L": [to_attr(v) for v in sorted(value, key=repr)]}
    return {"S": str(value)}


def _number(text: str) -> Decimal:
    return Decimal(text)


def from_attr(attr: Mapping[str, Any]) -> Any:
    """One DynamoDB attribute value as a python value (numbers as ``Decimal``)."""
    ((tag, raw),) = attr.items()
    if tag == "S":
        return raw
    if tag == "N":
        return _number(raw)
    if tag == "BOOL":
        return bool(raw)
    if tag == "NULL":
        return None
    if tag == "M":
        return {k: from_attr(v) for k, v in raw.items()}
    if tag == "L":
        return [from_attr(v) for v in raw]
    if tag == "B":
        return bytes(raw)
    if tag == "SS":
        return set(raw)
    if tag == "NS":
        return {_number(v) for v in raw}
    if tag == "BS":
        return {bytes(v) for v in raw}
    raise ValueError(f"unknown DynamoDB attribute type {tag!r}")


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


def expires_at(record: OpRecord, retention_days: int, now_ns: int) -> int:
    """The TTL of a terminal record: its applied time (or now) plus the retention, in seconds."""
    applied_ns = record.applied_ns or now_ns
    return applied_ns // NS_PER_SECOND + retention_days * SECONDS_PER_DAY


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
        item["open_update_ns"] = record.update_time_ns
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
        return self._put(
            record,
            condition="#version = :expected",
            names={"#version": "version"},
            values={":expected": {"N": str(expected_version)}},
        )

    def list_open(self, limit: int = 100) -> Sequence[OpRecord]:
        """Up to ``limit`` open records, oldest ``update_time_ns`` first (ties by name).

        Queries the sparse ``open-index`` GSI shard by shard (each ascending, at most ``limit``
        items) and merges. GSI reads are eventually consistent: a record that just became
        terminal can still show up for a moment; callers re-read or re-ingest anyway.
        """
        if limit <= 0:
            return []
        found: list[OpRecord] = []
        for shard in range(self.shards):
            found.extend(self._query_shard(shard, limit))
        found.sort(key=lambda r: (r.update_time_ns, r.name))
        return found[:limit]

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
            if exc.response.get("Error", {}).get("Code") == _VALIDATION:
                message = exc.response.get("Error", {}).get("Message", "")
                raise RecordRejectedError(
                    f"DynamoDB refused the item of {record.name}: {message}"
                ) from exc
            _fault(exc, "PutItem")
        except BotoCoreError as exc:
            _fault(exc, "PutItem")
        return WRITTEN

    def _query_shard(self, shard: int, limit: int) -> list[OpRecord]:
        out: list[OpRecord] = []
        start: dict[str, Any] | None = None
        while len(out) < limit:
            kwargs: dict[str, Any] = {
                "TableName": self.table_name,
                "IndexName": OPEN_INDEX,
                "KeyConditionExpression": "open_shard = :shard",
                "ExpressionAttributeValues": {":shard": {"N": str(shard)}},
                "ScanIndexForward": True,
                "Limit": limit - len(out),
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            try:
                page = self.client.query(**kwargs)
            except (ClientError, BotoCoreError) as exc:
                _fault(exc, "Query")
            out.extend(record_from_wire(item) for item in page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        return out
