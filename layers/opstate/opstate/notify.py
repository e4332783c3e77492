"""The notifier: DynamoDB Streams (the outbox) → one EventBridge event per state change.

Every applied change is a stream record, in order per operation (item key). For an ``INSERT``,
and for a ``MODIFY`` whose ``state`` differs between the old and the new image, one event goes
to the custom bus: source ``gemini-opstate``, detail-type ``Operation State Changed``, detail
``{name, kind, state, previousState, version, updateTime, details, idempotencyKey}`` with
``idempotencyKey = "<name>@<created_ns>#<version>"`` (see ``idempotency_key``). ``refreshed``
records (same state, newer time) and ``REMOVE`` (TTL expiry) emit nothing.

How it sits on Powertools' ``BatchProcessor`` (``EventType.DynamoDBStreams``, driven by
``process_partial_response``): the *record handler* is pure, it turns one stream record into
at most one ``PutEvents`` entry and never does I/O. ``OrderedPutEventsProcessor`` overrides
``process()`` with two phases, because a record's success is only known after its chunk was
sent:

1. build: the record handler runs on every record, in stream order (a record it cannot read is
   a failure of that record);
2. publish: the entries are sent in ``PutEvents`` calls of at most 10 entries (and at most
   256 KiB). A call takes at most one entry per operation, and only the *earliest* unsent entry
   of that operation, so a later version of an operation is never put before an earlier one was
   accepted. ``FailedEntryCount`` and each entry's ``ErrorCode`` are read; once a record of an
   operation failed (rejected entry, failed call, unreadable record), the later records of that
   operation in the batch are not sent and are reported as failed too ("held back").

Then every record is settled through Powertools' own ``success_handler``/``failure_handler``, so
``batchItemFailures`` lists exactly the failed records (their sequence numbers). Records that emit
nothing succeed. Lambda resumes the shard from the lowest reported sequence number, so records
after it are delivered again: delivery is at least once, with an idempotency key that makes it
effectively once (consumers drop duplicates by ``idempotencyKey``).

A record without a sequence number (no ``dynamodb`` section, or one without ``SequenceNumber``)
fails alone: it is logged at error level and counted in ``PublishFailures``, but it cannot be
named in ``batchItemFailures`` (Lambda treats a null identifier as the whole batch failing, and a
record with no position in the shard can never be read again anyway), so the rest of the batch
is settled normally.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import (
    DynamoDBRecord,
    DynamoDBRecordEventName,
)
from botocore.exceptions import BotoCoreError, ClientError

from opstate.config import ConfigError, Settings, settings
from opstate.observability import count, logger
from opstate.reducer import OpRecord
from opstate.store.dynamodb import record_from_item
from opstate.strict_json import dumps
from opstate.times import format_time

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
    from aws_lambda_powertools.utilities.typing import LambdaContext
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_events.type_defs import PutEventsRequestEntryTypeDef

SOURCE = "gemini-opstate"
DETAIL_TYPE = "Operation State Changed"
# PutEvents limits: 10 entries and 256 KiB per request (entry size as AWS counts it).
MAX_ENTRIES_PER_CALL = 10
MAX_REQUEST_BYTES = 256 * 1024


class InvalidStreamRecordError(ValueError):
    """A stream record the notifier cannot turn into an event (missing image or attribute)."""


class PublishError(Exception):
    """An entry was not accepted by EventBridge, or was held back behind one that was not."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


# --- building entries (pure) ----------------------------------------------------------------


def _record(image: Mapping[str, Any], which: str) -> OpRecord:
    try:
        return record_from_item(image)
    except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
        raise InvalidStreamRecordError(f"{which} is not an operation item: {exc!r}") from None


def idempotency_key(record: OpRecord) -> str:
    """One key per announced change for the record's whole life: ``<name>@<created_ns>#<version>``.

    ``version`` restarts at 1 when a record is created again (TTL removed a terminal record and
    discovery or a report re-created it); ``created_ns`` (the ingest clock when the record was
    created, copied to every later version) tells the incarnations apart. A record without a
    creation time (``created_ns`` 0) keeps the old ``<name>#<version>``, so its key is stable.
    Canonical names never contain ``@`` or ``#``.
    """
    if record.created_ns:
        return f"{record.name}@{record.created_ns}#{record.version}"
    return f"{record.name}#{record.version}"


def event_detail(record: OpRecord, previous_state: str | None) -> dict[str, Any]:
    """The detail announcing ``record``: ``previous_state`` is None for a new operation."""
    return {
        "name": record.name,
        "kind": str(record.kind),
        "state": str(record.state),
        "previousState": previous_state,
        "version": record.version,
        "updateTime": format_time(record.update_time_ns) if record.update_time_ns else None,
        "details": dict(record.details),
        "idempotencyKey": idempotency_key(record),
    }


def _dumps(detail: Mapping[str, Any]) -> str:
    return dumps(detail, compact=True)


def entry_size(entry: PutEventsRequestEntryTypeDef) -> int:
    """The size EventBridge charges against the 256 KiB request limit."""
    size = 14 if "Time" in entry else 0
    for key in ("Source", "DetailType", "Detail"):
        text = entry.get(key)
        if isinstance(text, str):
            size += len(text.encode("utf-8"))
    size += sum(len(r.encode("utf-8")) for r in entry.get("Resources", ()))
    return size


def build_entry(record: DynamoDBRecord, bus_name: str) -> PutEventsRequestEntryTypeDef | None:
    """The ``PutEvents`` entry announcing ``record``, or None when it announces nothing.

    INSERT → an entry with ``previousState`` null; MODIFY with a different ``state`` → an entry;
    MODIFY with the same state (``refreshed``) and REMOVE (TTL expiry) → None. Raises
    ``InvalidStreamRecordError`` for a record that lacks what it needs.
    """
    stream = record.dynamodb
    if stream is None:
        raise InvalidStreamRecordError("record has no 'dynamodb' section")
    event_name = record.event_name
    if event_name is DynamoDBRecordEventName.REMOVE:
        return None
    if event_name is DynamoDBRecordEventName.INSERT:
        old_image = None
    elif event_name is DynamoDBRecordEventName.MODIFY:
        old_image = stream.old_image
        if not old_image:
            raise InvalidStreamRecordError(
                "MODIFY without OldImage (the stream must be NEW_AND_OLD_IMAGES)"
            )
    else:
        raise InvalidStreamRecordError(f"unexpected eventName {record.get('eventName')!r}")
    new_image = stream.new_image
    if not new_image:
        raise InvalidStreamRecordError("record has no NewImage (the stream must carry images)")
    current = _record(new_image, "NewImage")
    previous = None if old_image is None else _record(old_image, "OldImage").state
    if previous is not None and previous == current.state:
        return None
    detail = event_detail(current, None if previous is None else str(previous))
    entry: PutEventsRequestEntryTypeDef = {
        "Source": SOURCE,
        "DetailType": DETAIL_TYPE,
        "Detail": _dumps(detail),
        "EventBusName": bus_name,
    }
    if entry_size(entry) > MAX_REQUEST_BYTES:
        # Never sendable as is: announce the change without details (consumers read the record).
        detail = {**detail, "details": {}, "detailsOmitted": True}
        entry["Detail"] = _dumps(detail)
    return entry


def _operation_key(record: DynamoDBRecord, position: int) -> str:
    """The item key (operation name) a record belongs to; unique fallback if unreadable."""
    try:
        stream = record.dynamodb
        name = stream.keys.get("name") if stream is not None else None
    except Exception:  # a malformed Keys map must not hide which record failed
        name = None
    return str(name) if isinstance(name, str) else f"<record {position}>"


# --- the processor -----------------------------------------------------------------------------


@dataclass
class _Item:
    position: int
    raw: dict[str, Any]
    record: DynamoDBRecord
    operation: str
    entry: PutEventsRequestEntryTypeDef | None = None
    size: int = 0
    error: BaseException | None = None
    event_id: str | None = None
    exc_info: tuple[Any, Any, Any] = field(default=(None, None, None))

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.exc_info = (type(error), error, error.__traceback__)


@dataclass
class PublishSummary:
    records: int = 0
    published: int = 0
    failed: int = 0
    skipped: int = 0
    # Failed records that have no sequence number, so cannot be listed in batchItemFailures.
    unreportable: int = 0


class OrderedPutEventsProcessor(BatchProcessor):
    """A ``BatchProcessor`` whose record handler builds entries and whose ``process`` sends them.

    The handler given to ``process_partial_response`` must be a pure builder
    ``(DynamoDBRecord) -> entry | None``. See the module docstring for the ordering rules.
    """

    def __init__(
        self,
        client: EventBridgeClient,
        *,
        max_entries: int = MAX_ENTRIES_PER_CALL,
        max_request_bytes: int = MAX_REQUEST_BYTES,
    ) -> None:
        if not 1 <= max_entries <= MAX_ENTRIES_PER_CALL:
            raise ValueError(f"max_entries must be between 1 and {MAX_ENTRIES_PER_CALL}")
        # Every record is settled explicitly, so an all-failed batch is reported like any other
        # (exactly its records), not raised.
        super().__init__(event_type=EventType.DynamoDBStreams, raise_on_entire_batch_failure=False)
        self.client = client
        self.max_entries = max_entries
        self.max_request_bytes = max_request_bytes
        self.calls = 0
        self.summary = PublishSummary()

    def process(self) -> list[tuple[Any, ...]]:
        # Per invocation: a warm container reuses this processor.
        self.calls = 0
        self.summary = PublishSummary(records=len(self.records))
        items = [self._build(position, raw) for position, raw in enumerate(self.records)]
        self._publish(items)
        return [self._settle(item) for item in items]

    def _build(self, position: int, raw: dict[str, Any]) -> _Item:
        record = DynamoDBRecord(raw)
        item = _Item(position, raw, record, _operation_key(record, position))
        try:
            item.entry = self.handler(record=record)
        except Exception as exc:
            item.fail(exc)
            return item
        if item.entry is not None:
            item.size = entry_size(item.entry)
            if item.size > self.max_request_bytes:
                item.fail(PublishError("EntryTooLarge", f"{item.size} bytes"))
        return item

    def _publish(self, items: Sequence[_Item]) -> None:
        # Position of the first failed record of each operation: later ones are held back.
        failed_from: dict[str, int] = {}
        for item in items:
            if item.error is not None:
                failed_from.setdefault(item.operation, item.position)
        queue = [item for item in items if item.entry is not None and item.error is None]
        while queue:
            chunk: list[_Item] = []
            rest: list[_Item] = []
            taken: set[str] = set()
            size = 0
            for item in queue:
                if failed_from.get(item.operation, item.position) < item.position:
                    item.fail(
                        PublishError(
                            "HeldBack", "an earlier record of this operation was not published"
                        )
                    )
                    continue
                fits = len(chunk) < self.max_entries and size + item.size <= self.max_request_bytes
                if fits and item.operation not in taken:
                    chunk.append(item)
                    size += item.size
                else:
                    rest.append(item)
                # Whether taken or deferred, no later entry of this operation may pass this one.
                taken.add(item.operation)
            if chunk:
                self._send(chunk)
                for item in chunk:
                    if item.error is not None:
                        failed_from.setdefault(item.operation, item.position)
            queue = rest

    def _send(self, chunk: Sequence[_Item]) -> None:
        entries = [item.entry for item in chunk if item.entry is not None]
        self.calls += 1
        try:
            response = self.client.put_events(Entries=entries)
        except (ClientError, BotoCoreError) as exc:
            code = "CallFailed"
            if isinstance(exc, ClientError):
                code = str(exc.response.get("Error", {}).get("Code") or code)
            for item in chunk:
                item.fail(PublishError(code, str(exc)))
            return
        results = list(response.get("Entries") or [])
        if response.get("FailedEntryCount", 0) and len(results) != len(chunk):
            logger.warning(
                "PutEvents returned a result list of the wrong length",
                extra={"sent": len(chunk), "results": len(results)},
            )
        for index, item in enumerate(chunk):
            result = results[index] if index < len(results) else {}
            error_code = result.get("ErrorCode")
            if error_code or not result.get("EventId"):
                item.fail(
                    PublishError(
                        str(error_code or "MissingResult"), str(result.get("ErrorMessage") or "")
                    )
                )
            else:
                item.event_id = result.get("EventId")

    def _settle(self, item: _Item) -> tuple[Any, ...]:
        if item.error is None:
            if item.entry is None:
                self.summary.skipped += 1
            else:
                self.summary.published += 1
            return self.success_handler(record=item.raw, result=item.event_id)
        self.summary.failed += 1
        sequence_number = _sequence_number(item.raw)
        extra = {
            "operation": item.operation,
            "sequence_number": sequence_number,
            "event_id": item.raw.get("eventID"),
            "event_name": item.raw.get("eventName"),
            "error": str(item.error),
            "error_code": getattr(item.error, "code", type(item.error).__name__),
        }
        if sequence_number is None:
            # Not listable: a null itemIdentifier would fail the whole batch. Counted and logged
            # loudly instead; settled as handled so Powertools reports the others.
            self.summary.unreportable += 1
            logger.error("stream record without a sequence number not published", extra=extra)
            return self.success_handler(record=item.raw, result=None)
        logger.warning("stream record not published", extra=extra)
        return self.failure_handler(record=item.record, exception=item.exc_info)


def _sequence_number(raw: Mapping[str, Any]) -> str | None:
    """The record's position in the shard, or None when the record carries none."""
    stream = raw.get("dynamodb")
    number = stream.get("SequenceNumber") if isinstance(stream, Mapping) else None
    return number if isinstance(number, str) and number else None


# --- the notifier and the Lambda entry ---------------------------------------------------------


class Notifier:
    """Turns one DynamoDB Streams event into ``PutEvents`` calls on ``bus_name``."""

    def __init__(
        self,
        bus_name: str,
        client: EventBridgeClient,
        *,
        max_entries: int = MAX_ENTRIES_PER_CALL,
    ) -> None:
        self.bus_name = bus_name
        self.processor = OrderedPutEventsProcessor(client, max_entries=max_entries)

    def record_handler(self, record: DynamoDBRecord) -> PutEventsRequestEntryTypeDef | None:
        return build_entry(record, self.bus_name)

    def handle(
        self, event: dict[str, Any], context: LambdaContext | None = None
    ) -> PartialItemFailureResponse:
        if isinstance(event, dict) and event.get("Records") == []:
            return {"batchItemFailures": []}  # Powertools rejects an empty batch; nothing to do
        response = process_partial_response(
            event=event,
            record_handler=self.record_handler,
            processor=self.processor,
            context=context,
        )
        summary = self.processor.summary
        if summary.published:
            count("EventsPublished", summary.published)
        if summary.failed:
            count("PublishFailures", summary.failed)
        logger.info(
            "stream batch processed",
            extra={
                "records": summary.records,
                "published": summary.published,
                "failed": summary.failed,
                "skipped": summary.skipped,
                "unreportable": summary.unreportable,
                "put_events_calls": self.processor.calls,
            },
        )
        return response


def make_events_client() -> EventBridgeClient:
    """A lean EventBridge client: standard retries, short timeouts, created once per process."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=3,
        read_timeout=10,
    )
    return boto3.session.Session().client("events", config=config)


def notifier_from_settings(config: Settings, client: EventBridgeClient | None = None) -> Notifier:
    if not config.event_bus_name:
        raise ConfigError(
            "OPSTATE_EVENT_BUS_NAME must name the event bus the notifier publishes to"
        )
    return Notifier(config.event_bus_name, client if client is not None else make_events_client())


@lru_cache(maxsize=1)
def _default_notifier() -> Notifier:
    return notifier_from_settings(settings())


def handle(
    event: dict[str, Any], context: LambdaContext | None = None
) -> PartialItemFailureResponse:
    """The Lambda entry: DynamoDB Streams batch in, ``{"batchItemFailures": [...]}`` out."""
    return _default_notifier().handle(event, context)


__all__ = [
    "DETAIL_TYPE",
    "SOURCE",
    "InvalidStreamRecordError",
    "Notifier",
    "OrderedPutEventsProcessor",
    "PublishError",
    "build_entry",
    "event_detail",
    "handle",
    "make_events_client",
    "notifier_from_settings",
]
