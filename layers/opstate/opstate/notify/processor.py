"""``OrderedPutEventsProcessor``: Powertools' ``BatchProcessor`` in two phases (build every entry,
then publish in order per operation) and the settling of each record; see the package docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from botocore.exceptions import BotoCoreError, ClientError

from opstate.notify.entries import (
    MAX_ENTRIES_PER_CALL,
    MAX_REQUEST_BYTES,
    entry_size,
    operation_key,
)
from opstate.observability import logger

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_events.type_defs import PutEventsRequestEntryTypeDef


class PublishError(Exception):
    """An entry was not accepted by EventBridge, or was held back behind one that was not."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


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
        item = _Item(position, raw, record, operation_key(record, position))
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
