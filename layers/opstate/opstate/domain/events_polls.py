"""The polled sources, read off google-genai objects or REST resources (duck-typed: never
importing google-genai): batch jobs (``from_batch_job``, Gemini API batches and Google Cloud
batch prediction jobs, whose ``outputInfo`` and ``completionStats`` are kept), long-running
operations (``from_operation``: Veo video on either backend, file-search imports) and
interactions (``from_interaction``). Pure; ``opstate.domain.events`` re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.domain.events_parsing import (
    UNKNOWN_STATE,
    Source,
    UnsupportedEventError,
    enum_text,
    field,
    key_of,
    parsed_name,
    sdk_time,
    with_model,
)
from opstate.domain.model import OpEvent
from opstate.domain.names import Kind
from opstate.domain.states import State

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


def from_batch_job(job: Any) -> OpEvent:
    """A google-genai ``BatchJob`` (or its mapping form): ``name``, ``state``, ``update_time``."""
    name = key_of(field(job, "name"), Kind.BATCH)
    raw_state = field(job, "state")
    if raw_state is None:
        raise UnsupportedEventError(UNKNOWN_STATE, f"batch {name} has no state")
    text = enum_text(raw_state)
    key = text.upper().removeprefix("JOB_STATE_").removeprefix("BATCH_STATE_")
    if key not in JOB_STATES or JOB_STATES[key] is None:
        raise UnsupportedEventError(UNKNOWN_STATE, f"batch {name} has unknown state {text!r}")
    mapped = JOB_STATES[key]
    assert mapped is not None
    state, extra = mapped
    details: dict[str, Any] = dict(extra)
    error = field(job, "error")
    if error is not None:
        code, message = field(error, "code"), field(error, "message")
        if code is not None:
            details["error_code"] = code
        if message is not None:
            details["error_message"] = message
    dest = field(job, "dest")
    output = field(dest, "file_name", "fileName") if dest is not None else None
    if output is not None:
        details["output_file_uri"] = output
    display = field(job, "display_name", "displayName")
    if display is not None:
        details["display_name"] = display
    details.update(_cloud_output(job))
    update_ns = sdk_time(field(job, "update_time", "updateTime"))
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
    info = field(job, "output_info", "outputInfo")
    if info is not None:
        location = field(
            info,
            "gcs_output_directory",
            "gcsOutputDirectory",
            "bigquery_output_table",
            "bigqueryOutputTable",
        )
        if isinstance(location, str) and location:
            found[OUTPUT_LOCATION] = location
    stats = field(job, "completion_stats", "completionStats")
    if stats is not None:
        counts = {
            key: count
            for key, spellings in COMPLETION_STATS_FIELDS.items()
            if (count := _count(field(stats, *spellings))) is not None
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
    parsed = parsed_name(field(op, "name"), None)
    name = parsed.key
    details: dict[str, Any] = with_model({}, parsed)
    error = field(op, "error")
    if error is not None and field(error, "code") == RPC_OK:
        error = None
    if not field(op, "done"):
        state = State.RUNNING
    elif error is not None:
        code = field(error, "code")
        message = field(error, "message")
        state = State.CANCELLED if code == RPC_CANCELLED else State.FAILED
        if code is not None:
            details["error_code"] = code
        if message is not None:
            details["error_message"] = message
    else:
        state = State.SUCCEEDED
        details.update(_video_details(field(op, "response", "result")))
    metadata = field(op, "metadata")
    update = field(metadata, "updateTime", "update_time") if metadata is not None else None
    return OpEvent(name, state, sdk_time(update), Source.POLL, details)


def _video_details(response: Any) -> dict[str, Any]:
    """What a finished Veo response says: ``video_uri`` and the filtered count and reasons."""
    if response is None:
        return {}
    nested = field(response, "generateVideoResponse")
    found: dict[str, Any] = {}
    uri = _video_uri(response, nested)
    if uri is not None:
        found["video_uri"] = uri
    holder = nested if nested is not None else response
    filtered = field(holder, "rai_media_filtered_count", "raiMediaFilteredCount")
    if isinstance(filtered, int) and not isinstance(filtered, bool) and filtered > 0:
        found[RAI_FILTERED_COUNT] = filtered
    reasons = field(holder, "rai_media_filtered_reasons", "raiMediaFilteredReasons")
    if isinstance(reasons, list | tuple) and reasons:
        found[RAI_FILTERED_REASONS] = [str(r) for r in reasons]
    return found


def _video_uri(response: Any, nested: Any) -> str | None:
    videos = field(response, "generated_videos", "generatedVideos", "generatedSamples")
    if not videos and nested is not None:
        videos = field(nested, "generatedSamples", "generated_samples")
    if not videos:
        # Google Cloud's REST shape: ``response.videos[]`` are the videos themselves.
        cloud = field(response, "videos")
        uri = field(cloud[0], "gcsUri", "gcs_uri") if cloud else None
        return uri if isinstance(uri, str) else None
    video = field(videos[0], "video")
    uri = field(video, "uri") if video is not None else None
    return uri if isinstance(uri, str) else None


def from_interaction(interaction: Any) -> OpEvent:
    """An interaction: ``id`` (or ``name``), ``status``, ``updated`` time."""
    name = key_of(field(interaction, "name", "id"), Kind.INTERACTION)
    status = field(interaction, "status")
    text = enum_text(status).lower() if status is not None else ""
    state = INTERACTION_STATUSES.get(text)
    if state is None:
        raise UnsupportedEventError(
            UNKNOWN_STATE, f"interaction {name} has unknown status {status!r}"
        )
    update_ns = sdk_time(field(interaction, "updated", "update_time", "updateTime"))
    details = {"reason": text} if text in INTERACTION_REASONS else {}
    return OpEvent(name, state, update_ns, Source.POLL, details)
