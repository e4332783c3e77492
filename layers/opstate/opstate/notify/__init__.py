"""The notifier: DynamoDB Streams (the outbox) → one EventBridge event per state change.

Every applied change is a stream record, in order per operation (item key). For an ``INSERT``,
and for a ``MODIFY`` whose ``state`` differs between the old and the new image, one event goes
to the custom bus: source ``gemini-opstate``, detail-type ``Operation State Changed``, detail
``{name, kind, state, previousState, version, updateTime, details, idempotencyKey}`` with
``idempotencyKey = "<name>@<created_ns>#<version>"`` (see ``idempotency_key``). ``refreshed``
records (same state, newer time) and ``REMOVE`` (TTL expiry) emit nothing.

The reconciler's marks go the same way (the table stays the outbox): a ``MODIFY`` whose new
image gains ``lost_ns`` announces ``Operation Lost`` (idempotencyKey ``<name>#lost#<lost_ns>``),
one that gains ``overdue_ns`` announces ``Operation Overdue`` (``<name>#overdue``); the detail
is the state change's plus ``lostAt`` / ``notFoundSince`` / ``notFoundCount`` or
``overdueAt`` / ``openSince``. So do the archiver's writes (``opstate.outcomes``): a ``MODIFY``
whose ``archive_status`` becomes ``archived`` announces ``Operation Results Archived``, one
that becomes ``expired`` after ``pending`` / ``failed`` announces ``Operation Results Lost``
(``results_detail``; JSON Schemas in ``schemas/``). The reconciler writes each mark on its
own, and the archiver each status, so one stream record carries at most one announcement.

So do the retry engine's writes of a root's retry slot (issue 33; the item's ``retry`` map,
``{status, created_ns, rev, due_ns, doc}``): a ``MODIFY`` whose new ``retry.doc.children`` has
exactly one more child in ``phase: "created"`` than the old announces **``Operation Retry
Submitted``** (``retry_submitted_detail``: ``root``, ``parent``, ``child`` (its Gemini name),
``attempt``, ``rows``; idempotencyKey ``<root>@<created_ns>#retry#<child id>``), one whose
``retry.doc.final.status`` becomes ``final`` announces **``Operation Results Final``**
(``results_final_detail``: ``root``, ``rows``, ``errors``, ``retried``, ``attempts``,
``location``; ``<root>@<created_ns>#final``). An old image without ``retry`` (an item written
before retries, or the slot's first write) announces nothing new.

Precedence, should one record carry several changes: a state change (or an ``INSERT``) wins
and is announced as ``Operation State Changed``; with the state unchanged, an archive outcome
wins over a mark, a mark over a retry change, and ``final`` over a submitted child. In practice
they never coincide: the engine writes the retry slot with an ``UpdateItem`` of its own
(``set_retry``, conditioned on the slot's ``rev``), never together with a state change (ingest
keeps the slot as it is), an archive status or a mark.

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
effectively once (consumers drop duplicates by ``idempotencyKey``). The batch's tally (``stream
batch processed``: records, published, failed, skipped, unreportable, ``PutEvents`` calls) is
logged at WARNING when a record failed, at DEBUG otherwise; ``EventsPublished`` and
``PublishFailures`` count every batch.

A record without a sequence number (no ``dynamodb`` section, or one without ``SequenceNumber``)
fails alone: it is logged at error level and counted in ``PublishFailures``, but it cannot be
named in ``batchItemFailures`` (Lambda treats a null identifier as the whole batch failing, and a
record with no position in the shard can never be read again anyway), so the rest of the batch
is settled normally.

The package owns the notifier: ``entries`` (the pure record handler: a stream record to at most
one entry), ``processor`` (publishing and settling a batch) and, here, the ``Notifier`` and the
Lambda entry ``handle``; every name callers use is re-exported here. It may import the domain,
settings, ``opstate.store`` (reading stream images), ``opstate.outcomes.plan`` (the results
shape) and ``opstate.observability``, never the API, the reconciler or anything above them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.utilities.batch import process_partial_response
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

from opstate.config import ConfigError, Settings, settings
from opstate.notify.entries import (
    DETAIL_TYPE,
    JOB_PART_CREATED_DETAIL_TYPE,
    LOST_DETAIL_TYPE,
    MAX_ENTRIES_PER_CALL,
    MAX_REQUEST_BYTES,
    OVERDUE_DETAIL_TYPE,
    RESULTS_ARCHIVED_DETAIL_TYPE,
    RESULTS_FINAL_DETAIL_TYPE,
    RESULTS_LOST_DETAIL_TYPE,
    RETRY_SUBMITTED_DETAIL_TYPE,
    SOURCE,
    InvalidStreamRecordError,
    build_entry,
    entry_size,
    event_detail,
    idempotency_key,
    mark_detail,
    results_detail,
    results_final_detail,
    retry_submitted_detail,
)
from opstate.notify.processor import OrderedPutEventsProcessor, PublishError, PublishSummary
from opstate.observability import count, logger

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
    from aws_lambda_powertools.utilities.typing import LambdaContext
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_events.type_defs import PutEventsRequestEntryTypeDef


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
        # The batch's tally is a line an operator acts on only when a record was not published
        # (each also has its own line); a clean batch is in the metrics alone (650 lines a
        # default day were a third of the application's log bytes, issue 48).
        log = logger.warning if summary.failed or summary.unreportable else logger.debug
        log(
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
    "JOB_PART_CREATED_DETAIL_TYPE",
    "LOST_DETAIL_TYPE",
    "MAX_ENTRIES_PER_CALL",
    "MAX_REQUEST_BYTES",
    "OVERDUE_DETAIL_TYPE",
    "RESULTS_ARCHIVED_DETAIL_TYPE",
    "RESULTS_FINAL_DETAIL_TYPE",
    "RESULTS_LOST_DETAIL_TYPE",
    "RETRY_SUBMITTED_DETAIL_TYPE",
    "SOURCE",
    "InvalidStreamRecordError",
    "Notifier",
    "OrderedPutEventsProcessor",
    "PublishError",
    "PublishSummary",
    "build_entry",
    "entry_size",
    "event_detail",
    "handle",
    "idempotency_key",
    "make_events_client",
    "mark_detail",
    "notifier_from_settings",
    "results_detail",
    "results_final_detail",
    "retry_submitted_detail",
]
