"""One event shape for every source of truth, and one normaliser per source.

Sources: Gemini webhook bodies, google-genai ``BatchJob`` objects (Gemini API batches and
Google Cloud batch prediction jobs, whose ``outputInfo`` and ``completionStats`` are kept),
long-running ``Operation`` objects (Veo video on either backend, file-search imports),
interactions, and generic reports from the user's
own producer. Normalisers are duck-typed: they read attributes or mapping keys and never import
google-genai, so they stay pure and cheap to import.

Two kinds of refusal:
- ``InvalidEventError`` (``code`` = ``invalid-body``, ``missing-field``, ``invalid-name``,
  ``invalid-time``, ``invalid-state``, ``invalid-details``): the input is malformed; answer
  400 and write nothing.
  A report's details are checked strictly (``details.check``): what no store can hold is
  ``invalid-details``. Other sources' details are normalised by the reducer instead, so
  Gemini's state always applies.
- ``UnsupportedEventError`` (``reason`` = ``unsupported-event-type`` or ``unknown-state``): a
  well-formed input that this system deliberately does not turn into a state (a source added a
  type or state). It must never roll anything back; webhooks answer 200 with ``applied: false``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from opstate.domain.details import InvalidDetailsError
from opstate.domain.details import check as check_details
from opstate.domain.model import OpEvent
from opstate.domain.names import (
    GOOGLE_CLOUD,
    VIDEO_DETAIL,
    InvalidNameError,
    Kind,
    ParsedName,
    backend_of,
    kind_of,
    parse_name,
)
from opstate.domain.states import State, UnknownStateError, parse_state
from opstate.domain.strict_json import InvalidJSONError, loads
from opstate.domain.times import NS_PER_SECOND, InvalidTimeError, format_time, parse_time


class Source(StrEnum):
    WEBHOOK = "webhook"
    POLL = "poll"
    REPORT = "report"


class EventError(ValueError):
    """Base of the normalisers' refusals; ``code`` is a stable machine-readable string."""

    code: str

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class InvalidEventError(EventError):
    """Malformed input: a client error, nothing is written."""


class UnsupportedEventError(EventError):
    """Well-formed input that deliberately never becomes a state."""

    @property
    def reason(self) -> str:
        return self.code


UNSUPPORTED_EVENT_TYPE = "unsupported-event-type"
UNKNOWN_STATE = "unknown-state"

# Gemini webhook event types: (state, kind hint, extra details).
WEBHOOK_TYPES: dict[str, tuple[State, Kind, Mapping[str, Any]]] = {
    "batch.succeeded": (State.SUCCEEDED, Kind.BATCH, {}),
    "batch.failed": (State.FAILED, Kind.BATCH, {}),
    "batch.expired": (State.FAILED, Kind.BATCH, {"reason": "expired"}),
    "batch.cancelled": (State.CANCELLED, Kind.BATCH, {}),
    "video.generated": (State.SUCCEEDED, Kind.VIDEO, {}),
    "interaction.completed": (State.SUCCEEDED, Kind.INTERACTION, {}),
    "interaction.failed": (State.FAILED, Kind.INTERACTION, {}),
    "interaction.cancelled": (State.CANCELLED, Kind.INTERACTION, {}),
    "interaction.requires_action": (State.REQUIRES_ACTION, Kind.INTERACTION, {}),
}

# The kind each family of webhook types names ("batch" for "batch.*"), read off WEBHOOK_TYPES.
WEBHOOK_FAMILIES: dict[str, Kind] = {
    event_type.partition(".")[0]: hint for event_type, (_, hint, _) in WEBHOOK_TYPES.items()
}


def webhook_kind_hint(event_type: object) -> Kind | None:
    """The kind of operation a webhook event type refers to: its own (``WEBHOOK_TYPES``), else
    its family's (``batch.paused``, a type not mapped yet: a batch); None when neither is known
    (reading the name of a delivery that is not turned into a state, for its log line)."""
    if not isinstance(event_type, str):
        return None
    mapped = WEBHOOK_TYPES.get(event_type)
    if mapped is not None:
        return mapped[1]
    return WEBHOOK_FAMILIES.get(event_type.partition(".")[0])


# Webhook `data` fields kept in a record's details.
WEBHOOK_DETAIL_FIELDS = (
    "output_file_uri",
    "video_uri",
    "error_code",
    "error_message",
    "user_metadata",
)

# google-genai JobState (and the REST API's BATCH_STATE_*) -> (state, extra details).
# None means the source state is known to carry no usable state (dropped as unknown-state).
# The in-progress states all carry both flags: details merge on refresh, so a job that was
# paused and resumed must say ``paused: False`` again.
_IN_PROGRESS = {"paused": False, "cancelling": False}
JOB_STATES: dict[str, tuple[State, Mapping[str, Any]] | None] = {
    "QUEUED": (State.PENDING, {}),
    "PENDING": (State.PENDING, {}),
    "RUNNING": (State.RUNNING, _IN_PROGRESS),
    "UPDATING": (State.RUNNING, _IN_PROGRESS),
    "PAUSED": (State.RUNNING, {**_IN_PROGRESS, "paused": True}),
    "CANCELLING": (State.RUNNING, {**_IN_PROGRESS, "cancelling": True}),
    "SUCCEEDED": (State.SUCCEEDED, {}),
    "PARTIALLY_SUCCEEDED": (State.SUCCEEDED, {"partial": True}),
    "FAILED": (State.FAILED, {}),
    "EXPIRED": (State.FAILED, {"reason": "expired"}),
    "CANCELLED": (State.CANCELLED, {}),
    "UNSPECIFIED": None,
}

# Interaction `status` -> state.
INTERACTION_STATUSES: dict[str, State] = {
    "queued": State.PENDING,
    "in_progress": State.RUNNING,
    "requires_action": State.REQUIRES_ACTION,
    # google-genai 3.x: IDLE replaces REQUIRES_ACTION ("processing done, waiting for the
    # caller"); requires_continuation stops at a token limit until the caller continues it.
    "idle": State.REQUIRES_ACTION,
    "requires_continuation": State.REQUIRES_ACTION,
    "completed": State.SUCCEEDED,
    "failed": State.FAILED,
    # Ended without a complete result: terminal, recorded as FAILED with the reason kept.
    "incomplete": State.FAILED,
    "budget_exceeded": State.FAILED,
    "cancelled": State.CANCELLED,
}

# Interaction statuses whose status text is kept as details.reason.
INTERACTION_REASONS: frozenset[str] = frozenset(
    {"incomplete", "budget_exceeded", "requires_continuation", "idle"}
)

# google.rpc.Code OK and CANCELLED: an LRO that finished with an ``error`` of code 0 succeeded
# (an empty Status), one with code 1 was cancelled.
RPC_OK = 0
RPC_CANCELLED = 1

# Veo: how many generated videos the responsible-AI filters removed, and why (details keys).
RAI_FILTERED_COUNT = "rai_media_filtered_count"
RAI_FILTERED_REASONS = "rai_media_filtered_reasons"


def _get(obj: Any, *keys: str) -> Any:
    """The first present, non-None value among ``keys`` of a mapping or an object."""
    for key in keys:
        value = obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)
        if value is not None:
            return value
    return None


def _name(raw: object, hint: Kind | None) -> str:
    return _parsed(raw, hint).key


def _parsed(raw: object, hint: Kind | None) -> ParsedName:
    if raw is None:
        raise InvalidEventError("missing-field", "no operation name ('name' or 'id')")
    try:
        return parse_name(raw, hint)
    except InvalidNameError as exc:
        raise InvalidEventError("invalid-name", str(exc)) from None


def _with_model(details: dict[str, Any], parsed: ParsedName) -> dict[str, Any]:
    """Keep a video name's model (``details.model``): polling needs it to rebuild the name."""
    if parsed.model is not None:
        details[VIDEO_DETAIL] = parsed.model
    return details


def _time(raw: object) -> int:
    if raw is None:
        return 0
    if not isinstance(raw, str | datetime):
        raise InvalidEventError("invalid-time", f"invalid time {raw!r}: expected RFC3339 text")
    try:
        return parse_time(raw)
    except InvalidTimeError as exc:
        raise InvalidEventError("invalid-time", str(exc)) from None


def _sdk_time(raw: object) -> int:
    """A time read off a google-genai object or a REST resource read through its client: a
    naive ``datetime`` is UTC (the SDK parses Gemini's times, which are UTC, and drops a
    missing offset), and so is naive ISO text (the same time before the SDK parsed it); other
    text is parsed as RFC3339. Reports from producers stay strict (``_time``)."""
    if isinstance(raw, datetime) and raw.utcoffset() is None:
        raw = raw.replace(tzinfo=UTC)
    elif isinstance(raw, str) and _naive_iso(raw):
        raw = raw + "Z"
    return _time(raw)


def _naive_iso(text: str) -> bool:
    """True for ISO date-time text with a time of day and no offset (``2026-05-01T10:30:00``)."""
    if "T" not in text and "t" not in text:
        return False
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return False
    return parsed.utcoffset() is None


def check_future_skew(event: OpEvent, *, now_ns: int, max_skew_s: float) -> OpEvent:
    """``event`` itself when its time is at most ``max_skew_s`` past ``now_ns`` (the receiver's
    clock); else ``InvalidEventError`` ``invalid-time``. A time far in the future would freeze
    the record: every later in-progress observation would be dropped as stale."""
    limit_ns = now_ns + int(max_skew_s * NS_PER_SECOND)
    if event.update_time_ns > limit_ns:
        raise InvalidEventError(
            "invalid-time",
            f"event time {format_time(event.update_time_ns)} is more than {max_skew_s:g} s "
            f"ahead of this receiver's clock ({format_time(now_ns)})",
        )
    return event


def _enum_text(value: Any) -> str:
    """The text of an enum member or a string (``JobState.JOB_STATE_RUNNING`` -> its value)."""
    text = getattr(value, "value", value)
    return str(text)


def from_webhook(body: object) -> OpEvent:
    """A Gemini webhook body: ``{"type", "timestamp", "data": {"id"|"name", ...}}``."""
    if not isinstance(body, Mapping):
        raise InvalidEventError("invalid-body", "the webhook body must be a JSON object")
    event_type = body.get("type")
    if not isinstance(event_type, str) or not event_type:
        raise InvalidEventError("missing-field", "the webhook body has no 'type' string")
    # An unknown type is dropped whatever shape its body has: a new event type must never be
    # answered 400 (the sender would retry for a day and then disable the endpoint).
    mapped = WEBHOOK_TYPES.get(event_type)
    if mapped is None:
        raise UnsupportedEventError(
            UNSUPPORTED_EVENT_TYPE, f"webhook event type {event_type!r} is not supported"
        )
    data = body.get("data")
    if not isinstance(data, Mapping):
        raise InvalidEventError("missing-field", "the webhook body has no 'data' object")
    state, hint, extra = mapped
    raw_name = _get(data, "id", "name")
    if raw_name is None:
        raise InvalidEventError("missing-field", "the webhook 'data' has no 'id' or 'name'")
    parsed = _parsed(raw_name, hint)
    update_ns = _time(body.get("timestamp"))
    details: dict[str, Any] = {k: data[k] for k in WEBHOOK_DETAIL_FIELDS if data.get(k) is not None}
    details.update(extra)
    return OpEvent(parsed.key, state, update_ns, Source.WEBHOOK, _with_model(details, parsed))


def from_batch_job(job: Any) -> OpEvent:
    """A google-genai ``BatchJob`` (or its mapping form): ``name``, ``state``, ``update_time``."""
    name = _name(_get(job, "name"), Kind.BATCH)
    raw_state = _get(job, "state")
    if raw_state is None:
        raise UnsupportedEventError(UNKNOWN_STATE, f"batch {name} has no state")
    text = _enum_text(raw_state)
    key = text.upper().removeprefix("JOB_STATE_").removeprefix("BATCH_STATE_")
    if key not in JOB_STATES or JOB_STATES[key] is None:
        raise UnsupportedEventError(UNKNOWN_STATE, f"batch {name} has unknown state {text!r}")
    mapped = JOB_STATES[key]
    assert mapped is not None
    state, extra = mapped
    details: dict[str, Any] = dict(extra)
    error = _get(job, "error")
    if error is not None:
        code, message = _get(error, "code"), _get(error, "message")
        if code is not None:
            details["error_code"] = code
        if message is not None:
            details["error_message"] = message
    dest = _get(job, "dest")
    output = _get(dest, "file_name", "fileName") if dest is not None else None
    if output is not None:
        details["output_file_uri"] = output
    display = _get(job, "display_name", "displayName")
    if display is not None:
        details["display_name"] = display
    details.update(_cloud_output(job))
    update_ns = _sdk_time(_get(job, "update_time", "updateTime"))
    return OpEvent(name, state, update_ns, Source.POLL, details)


# A Google Cloud batch job's ``completionStats`` fields -> the keys kept in details.
COMPLETION_STATS_FIELDS: dict[str, tuple[str, ...]] = {
    "successful_count": ("successful_count", "successfulCount"),
    "failed_count": ("failed_count", "failedCount"),
    "incomplete_count": ("incomplete_count", "incompleteCount"),
    "successful_forecast_point_count": (
        "successful_forecast_point_count",
        "successfulForecastPointCount",
    ),
}
OUTPUT_LOCATION = "output_location"
COMPLETION_STATS = "completion_stats"


def _count(value: Any) -> int | None:
    """A count as the REST API sends it (int64 as a JSON string) or as the SDK parsed it."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def _cloud_output(job: Any) -> dict[str, Any]:
    """A Google Cloud batch job's results pointer and counts: ``outputInfo``'s
    ``gcsOutputDirectory`` or ``bigqueryOutputTable`` as ``output_location``, and
    ``completionStats`` as the ``completion_stats`` map (``successful_count``,
    ``failed_count``, ``incomplete_count``...). Nothing for a Gemini API job."""
    found: dict[str, Any] = {}
    info = _get(job, "output_info", "outputInfo")
    if info is not None:
        location = _get(
            info,
            "gcs_output_directory",
            "gcsOutputDirectory",
            "bigquery_output_table",
            "bigqueryOutputTable",
        )
        if isinstance(location, str) and location:
            found[OUTPUT_LOCATION] = location
    stats = _get(job, "completion_stats", "completionStats")
    if stats is not None:
        counts = {
            key: count
            for key, spellings in COMPLETION_STATS_FIELDS.items()
            if (count := _count(_get(stats, *spellings))) is not None
        }
        if counts:
            found[COMPLETION_STATS] = counts
    return found


def from_operation(op: Any) -> OpEvent:
    """A long-running ``Operation``: ``done=false`` RUNNING; ``error.code == 1`` CANCELLED;
    another error FAILED (``error.code == 0`` is google.rpc's OK: no error); otherwise (a
    response) SUCCEEDED, with the video's URI and, when Veo's filters removed videos, their
    count and reasons. The time is ``metadata.updateTime`` when the operation carries one,
    else 0 (unknown)."""
    parsed = _parsed(_get(op, "name"), None)
    name = parsed.key
    details: dict[str, Any] = _with_model({}, parsed)
    error = _get(op, "error")
    if error is not None and _get(error, "code") == RPC_OK:
        error = None
    if not _get(op, "done"):
        state = State.RUNNING
    elif error is not None:
        code = _get(error, "code")
        message = _get(error, "message")
        state = State.CANCELLED if code == RPC_CANCELLED else State.FAILED
        if code is not None:
            details["error_code"] = code
        if message is not None:
            details["error_message"] = message
    else:
        state = State.SUCCEEDED
        details.update(_video_details(_get(op, "response", "result")))
    metadata = _get(op, "metadata")
    update = _get(metadata, "updateTime", "update_time") if metadata is not None else None
    return OpEvent(name, state, _sdk_time(update), Source.POLL, details)


def _video_details(response: Any) -> dict[str, Any]:
    """What a finished Veo response says: ``video_uri`` and the filtered count and reasons."""
    if response is None:
        return {}
    nested = _get(response, "generateVideoResponse")
    found: dict[str, Any] = {}
    uri = _video_uri(response, nested)
    if uri is not None:
        found["video_uri"] = uri
    holder = nested if nested is not None else response
    filtered = _get(holder, "rai_media_filtered_count", "raiMediaFilteredCount")
    if isinstance(filtered, int) and not isinstance(filtered, bool) and filtered > 0:
        found[RAI_FILTERED_COUNT] = filtered
    reasons = _get(holder, "rai_media_filtered_reasons", "raiMediaFilteredReasons")
    if isinstance(reasons, list | tuple) and reasons:
        found[RAI_FILTERED_REASONS] = [str(r) for r in reasons]
    return found


def _video_uri(response: Any, nested: Any) -> str | None:
    videos = _get(response, "generated_videos", "generatedVideos", "generatedSamples")
    if not videos and nested is not None:
        videos = _get(nested, "generatedSamples", "generated_samples")
    if not videos:
        # Google Cloud's REST shape: ``response.videos[]`` are the videos themselves.
        cloud = _get(response, "videos")
        uri = _get(cloud[0], "gcsUri", "gcs_uri") if cloud else None
        return uri if isinstance(uri, str) else None
    video = _get(videos[0], "video")
    uri = _get(video, "uri") if video is not None else None
    return uri if isinstance(uri, str) else None


def from_pubsub(envelope: object) -> OpEvent:
    """A Pub/Sub push delivery for a Google Cloud Veo operation.

    The envelope is Pub/Sub's documented push body ``{"message": {"data": <base64>,
    "attributes", "messageId", "publishTime"}, "subscription"}``. What Veo publishes in
    ``data`` is not documented (google-genai 3.6.1 only says ``pubsub_topic`` receives "the
    video generation progress"), so only what can be checked is accepted: ``data`` decodes to
    a ``google.longrunning.Operation`` JSON (``name``, ``done``, ``error``, ``response``, the
    shape ``fetchPredictOperation`` answers) naming a Cloud Veo operation
    (``projects/.../publishers/google/models/M/operations/ID``). Its time is the operation's
    ``metadata.updateTime``, else the message's ``publishTime``. Anything else is an
    ``InvalidEventError`` (the receiver quarantines it).
    """
    if not isinstance(envelope, Mapping):
        raise InvalidEventError("invalid-body", "the Pub/Sub push body must be a JSON object")
    message = envelope.get("message")
    if not isinstance(message, Mapping):
        raise InvalidEventError("missing-field", "the Pub/Sub push body has no 'message' object")
    data = message.get("data")
    if not isinstance(data, str) or not data:
        raise InvalidEventError("missing-field", "the Pub/Sub message has no 'data' string")
    try:
        operation = loads(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError, InvalidJSONError):
        raise InvalidEventError(
            "invalid-body", "the Pub/Sub message data is not base64-encoded JSON"
        ) from None
    if not isinstance(operation, Mapping):
        raise InvalidEventError("invalid-body", "the Pub/Sub message data is not a JSON object")
    parsed = _parsed(_get(operation, "name"), Kind.VIDEO)
    if backend_of(parsed.key) != GOOGLE_CLOUD or kind_of(parsed.key) is not Kind.VIDEO:
        raise InvalidEventError("invalid-name", f"{parsed.key} is not a Google Cloud Veo operation")
    event = from_operation(operation)
    update_ns = event.update_time_ns or _time(message.get("publishTime"))
    return OpEvent(event.name, event.state, update_ns, Source.WEBHOOK, event.details)


def from_interaction(interaction: Any) -> OpEvent:
    """An interaction: ``id`` (or ``name``), ``status``, ``updated`` time."""
    name = _name(_get(interaction, "name", "id"), Kind.INTERACTION)
    status = _get(interaction, "status")
    text = _enum_text(status).lower() if status is not None else ""
    state = INTERACTION_STATUSES.get(text)
    if state is None:
        raise UnsupportedEventError(
            UNKNOWN_STATE, f"interaction {name} has unknown status {status!r}"
        )
    update_ns = _sdk_time(_get(interaction, "updated", "update_time", "updateTime"))
    details = {"reason": text} if text in INTERACTION_REASONS else {}
    return OpEvent(name, state, update_ns, Source.POLL, details)


def from_report(
    name: object,
    body: Mapping[str, Any] | None,
    *,
    now_ns: int,
    kind_hint: Kind | None = None,
    max_future_skew_s: float | None = None,
) -> OpEvent:
    """A report from the user's own producer: optional ``{"state", "updateTime", "details"}``.

    No body (or no ``state``) means "track this job": PENDING. No ``updateTime`` means
    ``now_ns``, which the caller reads from its clock (this module reads none). With
    ``max_future_skew_s``, an ``updateTime`` more than that ahead of ``now_ns`` is
    ``invalid-time`` (``check_future_skew``).
    """
    parsed = _parsed(name, kind_hint)
    if body is None:
        body = {}
    if not isinstance(body, Mapping):
        raise InvalidEventError("invalid-body", "the report body must be a JSON object")
    raw_state = body.get("state")
    if raw_state is None:
        state = State.PENDING
    elif not isinstance(raw_state, str):
        raise InvalidEventError("invalid-state", f"'state' must be a string, not {raw_state!r}")
    else:
        try:
            state = parse_state(raw_state)
        except UnknownStateError as exc:
            raise UnsupportedEventError(UNKNOWN_STATE, str(exc)) from None
    raw_time = body.get("updateTime")
    update_ns = now_ns if raw_time is None else _time(raw_time)
    details = body.get("details")
    if details is None:
        details = {}
    if not isinstance(details, Mapping):
        raise InvalidEventError("invalid-details", "'details' must be a JSON object")
    try:
        checked = check_details(details)
    except InvalidDetailsError as exc:
        raise InvalidEventError("invalid-details", str(exc)) from None
    event = OpEvent(parsed.key, state, update_ns, Source.REPORT, _with_model(checked, parsed))
    if max_future_skew_s is None:
        return event
    return check_future_skew(event, now_ns=now_ns, max_skew_s=max_future_skew_s)
