"""Building ``PutEvents`` entries from stream records: pure, no I/O (the record handler).

See the package docstring for what a record announces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import (
    DynamoDBRecord,
    DynamoDBRecordEventName,
)

from opstate.domain.costs import final_cost_view
from opstate.domain.model import OpRecord
from opstate.domain.strict_json import dumps
from opstate.domain.times import format_time
from opstate.outcomes.plan import record_results, results_view
from opstate.store.counters import is_counter
from opstate.store.dynamodb import plain, record_from_item

if TYPE_CHECKING:
    from mypy_boto3_events.type_defs import PutEventsRequestEntryTypeDef

SOURCE = "gemini-opstate"
DETAIL_TYPE = "Operation State Changed"
LOST_DETAIL_TYPE = "Operation Lost"
OVERDUE_DETAIL_TYPE = "Operation Overdue"
RESULTS_ARCHIVED_DETAIL_TYPE = "Operation Results Archived"
RESULTS_LOST_DETAIL_TYPE = "Operation Results Lost"
RETRY_SUBMITTED_DETAIL_TYPE = "Operation Retry Submitted"
RESULTS_FINAL_DETAIL_TYPE = "Operation Results Final"
JOB_PART_CREATED_DETAIL_TYPE = "Job Part Created"
# PutEvents limits: 10 entries and 256 KiB per request (entry size as AWS counts it).
MAX_ENTRIES_PER_CALL = 10
MAX_REQUEST_BYTES = 256 * 1024


class InvalidStreamRecordError(ValueError):
    """A stream record the notifier cannot turn into an event (missing image or attribute)."""


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


def _ns(image: Mapping[str, Any] | None, key: str) -> int:
    if not image:
        return 0
    value = image.get(key)
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError, ArithmeticError):
        raise InvalidStreamRecordError(f"{key} is not a number: {value!r}") from None


def _when(ns: int) -> str | None:
    return format_time(ns) if ns > 0 else None


def mark_detail(record: OpRecord, image: Mapping[str, Any], detail_type: str) -> dict[str, Any]:
    """The detail of an ``Operation Lost`` / ``Operation Overdue`` event for ``image``."""
    detail = event_detail(record, str(record.state))
    del detail["previousState"]
    if detail_type == LOST_DETAIL_TYPE:
        lost_ns = _ns(image, "lost_ns")
        detail.update(
            lostAt=_when(lost_ns),
            notFoundSince=_when(_ns(image, "poll_missing_since_ns")),
            notFoundCount=_ns(image, "poll_misses"),
            idempotencyKey=f"{record.name}#lost#{lost_ns}",
        )
    else:
        detail.update(
            overdueAt=_when(_ns(image, "overdue_ns")),
            openSince=_when(record.created_ns or record.update_time_ns),
            idempotencyKey=f"{record.name}#overdue",
        )
    return detail


def _mark_type(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """The mark a same-state MODIFY newly sets, if any (lost wins if, unexpectedly, both)."""
    lost = _ns(new, "lost_ns")
    if lost and lost != _ns(old, "lost_ns"):
        return LOST_DETAIL_TYPE
    if _ns(new, "overdue_ns") and not _ns(old, "overdue_ns"):
        return OVERDUE_DETAIL_TYPE
    return None


def _archive_type(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """The announcement of an archive write: newly ``archived``, or newly ``expired`` after
    waiting (``pending`` / ``failed``) for a copy; None for any other archive write."""
    before, after = old.get("archive_status"), new.get("archive_status")
    if after == before:
        return None
    if after == "archived":
        return RESULTS_ARCHIVED_DETAIL_TYPE
    if after == "expired" and before in ("pending", "failed"):
        return RESULTS_LOST_DETAIL_TYPE
    return None


def results_detail(record: OpRecord, image: Mapping[str, Any], detail_type: str) -> dict[str, Any]:
    """The detail of ``Operation Results Archived`` / ``Operation Results Lost``: the
    operation's ``name``, ``kind``, ``state``, then the ``opstate results --json`` fields
    (``status``, ``expiresAt``, ``archivedAt``, ``objects``, ``rows``, ``errors``, ``usage``,
    ``requests``), the ``summary.json`` ``location``, ``videos`` when there are, and for a loss
    ``attempts`` and ``lastError``; ``idempotencyKey``
    ``<name>@<created_ns>#results-archived`` (or ``#results-lost``)."""
    raw = image.get("archive")
    archive = plain(raw) if isinstance(raw, Mapping) else {}
    view = results_view(record.name, archive)
    summary = archive.get("summary") if isinstance(archive.get("summary"), Mapping) else {}
    detail: dict[str, Any] = {
        "name": record.name,
        "kind": str(record.kind),
        "state": str(record.state),
        **{k: v for k, v in view.items() if k != "name"},
        "location": record_results(archive)["location"],
    }
    if isinstance(summary, Mapping) and isinstance(summary.get("videos"), Mapping):
        detail["videos"] = dict(summary["videos"])
    suffix = "results-archived"
    if detail_type == RESULTS_LOST_DETAIL_TYPE:
        suffix = "results-lost"
        detail["attempts"] = int(archive.get("attempts") or 0)
        detail["lastError"] = archive.get("last_error") or None
    detail["idempotencyKey"] = f"{record.name}@{record.created_ns}#{suffix}"
    return detail


def _retry_doc(image: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``doc`` of the image's retry slot (issue 33), or None when the item has none (an
    item written before retries, or a record without a policy) or its shape is not a map."""
    raw = image.get("retry")
    if not isinstance(raw, Mapping):
        return None
    doc = plain(raw).get("doc")
    return doc if isinstance(doc, Mapping) else None


def _final_status(doc: Mapping[str, Any] | None) -> object:
    final = doc.get("final") if doc is not None else None
    return final.get("status") if isinstance(final, Mapping) else None


def _created(doc: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The children of ``doc`` whose Gemini batch was created, in the doc's order."""
    children = doc.get("children") if doc is not None else None
    if not isinstance(children, list):
        return []
    return [c for c in children if isinstance(c, Mapping) and c.get("phase") == "created"]


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def retry_submitted_detail(record: OpRecord, child: Mapping[str, Any]) -> dict[str, Any]:
    """The detail of ``Operation Retry Submitted``: the ``root`` (the record's name), the
    child's ``parent``, ``child`` (its Gemini name), ``attempt`` and ``rows``; idempotencyKey
    ``<root>@<created_ns>#retry#<child id>``."""
    name, child_id, parent = child.get("name"), child.get("id"), child.get("parent")
    if not isinstance(name, str) or not name or not isinstance(child_id, str) or not child_id:
        raise InvalidStreamRecordError(f"a created retry child without a name or id: {child!r}")
    return {
        "root": record.name,
        "parent": parent if isinstance(parent, str) and parent else record.name,
        "child": name,
        "attempt": _count(child.get("attempt")),
        "rows": _count(child.get("rows")),
        "idempotencyKey": f"{record.name}@{record.created_ns}#retry#{child_id}",
    }


def results_final_detail(record: OpRecord, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The detail of ``Operation Results Final``: the ``root``, the final ledger's ``rows``
    (``total``, ``answered``, ``blocked``, ``failed``), ``errors`` (failed rows by code text),
    ``retried``, ``attempts``, the ``location`` of ``final.jsonl``, its ``cost``
    (``costs.final_cost_view``) and why it ``stopped`` (null: it did not); idempotencyKey
    ``<root>@<created_ns>#final``."""
    final = doc.get("final")
    assert isinstance(final, Mapping)  # _retry_type saw its status
    raw_rows, raw_errors = final.get("rows"), final.get("errors")
    rows: Mapping[str, Any] = raw_rows if isinstance(raw_rows, Mapping) else {}
    errors: Mapping[str, Any] = raw_errors if isinstance(raw_errors, Mapping) else {}
    location = final.get("location")
    return {
        "root": record.name,
        "rows": {k: _count(rows.get(k)) for k in ("total", "answered", "blocked", "failed")},
        "errors": {str(code): _count(n) for code, n in errors.items()},
        "retried": _count(final.get("retried")),
        "attempts": _count(final.get("attempts")),
        "location": location if isinstance(location, str) and location else None,
        "cost": final_cost_view(final.get("cost")),
        "stopped": doc.get("stopped") if isinstance(doc.get("stopped"), str) else None,
        "idempotencyKey": f"{record.name}@{record.created_ns}#final",
    }


def _parts(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    job = doc.get("job")
    parts = job.get("parts") if isinstance(job, Mapping) else None
    return [p for p in parts if isinstance(p, Mapping)] if isinstance(parts, list) else []


def _part_created(old: Mapping[str, Any], new: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The one part of a job's plan (issue 46) newly created by this write, if exactly one."""
    before = {p.get("n") for p in _parts(old) if p.get("batch")}
    fresh = [p for p in _parts(new) if p.get("batch") and p.get("n") not in before]
    return fresh[0] if len(fresh) == 1 else None


def job_part_detail(record: OpRecord, part: Mapping[str, Any]) -> dict[str, Any]:
    """The detail of ``Job Part Created``: the ``job``, the part's number, its ``batch``, its
    ``rows`` and estimated ``tokens``; idempotencyKey ``<job>@<created_ns>#part#<n>`` (the
    part's nonce is never published)."""
    batch = part.get("batch")
    if not isinstance(batch, str) or not batch:
        raise InvalidStreamRecordError(f"a created job part without a batch: {part!r}")
    number = _count(part.get("n"))
    return {
        "job": record.name,
        "part": number,
        "batch": batch,
        "rows": _count(part.get("rows")),
        "tokens": _count(part.get("tokens")),
        "idempotencyKey": f"{record.name}@{record.created_ns}#part#{number}",
    }


def _retry_detail(
    current: OpRecord, old_image: Mapping[str, Any], new_image: Mapping[str, Any]
) -> tuple[str, dict[str, Any]] | None:
    """What a retry-state write announces: the final result newly ``final``, else exactly one
    more child newly ``created``; nothing when either image has no retry slot."""
    old, new = _retry_doc(old_image), _retry_doc(new_image)
    if old is None or new is None:
        return None
    if _final_status(new) == "final" and _final_status(old) != "final":
        return RESULTS_FINAL_DETAIL_TYPE, results_final_detail(current, new)
    part = _part_created(old, new)
    if part is not None:
        return JOB_PART_CREATED_DETAIL_TYPE, job_part_detail(current, part)
    before = {c.get("id") for c in _created(old)}
    fresh = [c for c in _created(new) if c.get("id") not in before]
    if len(fresh) != 1 or len(_created(new)) != len(before) + 1:
        return None
    return RETRY_SUBMITTED_DETAIL_TYPE, retry_submitted_detail(current, fresh[0])


def _same_state_detail(
    current: OpRecord, old_image: Mapping[str, Any], new_image: Mapping[str, Any]
) -> tuple[str, dict[str, Any]] | None:
    """What a same-state MODIFY announces, the first that applies: an archive outcome, a newly
    set mark, a retry-state change (final, then a submitted child), or nothing."""
    outcome = _archive_type(old_image, new_image)
    if outcome is not None:
        return outcome, results_detail(current, new_image, outcome)
    mark = _mark_type(old_image, new_image)
    if mark is not None:
        return mark, mark_detail(current, new_image, mark)
    return _retry_detail(current, old_image, new_image)


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
    MODIFY with the same state: an archive outcome, a mark or a retry-state change
    (``_same_state_detail``), else None (``refreshed``); REMOVE (TTL expiry) → None. Raises
    ``InvalidStreamRecordError`` for a record that lacks what it needs.
    """
    stream = record.dynamodb
    if stream is None:
        raise InvalidStreamRecordError("record has no 'dynamodb' section")
    event_name = record.event_name
    # A counter's item (store.counters) is no operation: nothing to announce.
    if event_name is DynamoDBRecordEventName.REMOVE or is_counter((stream.keys or {}).get("name")):
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
    detail_type = DETAIL_TYPE
    if previous is not None and previous == current.state:
        assert old_image is not None
        announced = _same_state_detail(current, old_image, new_image)
        if announced is None:
            return None
        detail_type, detail = announced
    else:
        detail = event_detail(current, None if previous is None else str(previous))
    entry: PutEventsRequestEntryTypeDef = {
        "Source": SOURCE,
        "DetailType": detail_type,
        "Detail": _dumps(detail),
        "EventBusName": bus_name,
    }
    if entry_size(entry) > MAX_REQUEST_BYTES:
        # Never sendable as is: announce the change without details (consumers read the record).
        detail = {**detail, "details": {}, "detailsOmitted": True}
        entry["Detail"] = _dumps(detail)
    return entry


def operation_key(record: DynamoDBRecord, position: int) -> str:
    """The item key (operation name) a record belongs to; unique fallback if unreadable."""
    try:
        stream = record.dynamodb
        name = stream.keys.get("name") if stream is not None else None
    except Exception:  # a malformed Keys map must not hide which record failed
        name = None
    return str(name) if isinstance(name, str) else f"<record {position}>"
