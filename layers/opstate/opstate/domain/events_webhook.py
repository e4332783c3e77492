"""The pushed sources: Gemini webhook bodies (``from_webhook``) and Pub/Sub push deliveries for
Google Cloud Veo operations (``from_pubsub``). Pure; ``opstate.domain.events`` re-exports them.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from opstate.domain.events_parsing import (
    UNSUPPORTED_EVENT_TYPE,
    InvalidEventError,
    Source,
    UnsupportedEventError,
    event_time,
    field,
    parsed_name,
    with_model,
)
from opstate.domain.model import OpEvent
from opstate.domain.names import GOOGLE_CLOUD, Kind, backend_of, kind_of
from opstate.domain.states import State
from opstate.domain.strict_json import InvalidJSONError, loads

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
    raw_name = field(data, "id", "name")
    if raw_name is None:
        raise InvalidEventError("missing-field", "the webhook 'data' has no 'id' or 'name'")
    parsed = parsed_name(raw_name, hint)
    update_ns = event_time(body.get("timestamp"))
    details: dict[str, Any] = {k: data[k] for k in WEBHOOK_DETAIL_FIELDS if data.get(k) is not None}
    details.update(extra)
    return OpEvent(parsed.key, state, update_ns, Source.WEBHOOK, with_model(details, parsed))


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
    parsed = parsed_name(field(operation, "name"), Kind.VIDEO)
    if backend_of(parsed.key) != GOOGLE_CLOUD or kind_of(parsed.key) is not Kind.VIDEO:
        raise InvalidEventError("invalid-name", f"{parsed.key} is not a Google Cloud Veo operation")
    # Imported here: a Pub/Sub push is rare, and the webhook's init never loads the polled
    # sources' module for it (docs/api.md, "Cold start").
    from opstate.domain.events_polls import from_operation

    event = from_operation(operation)
    update_ns = event.update_time_ns or event_time(message.get("publishTime"))
    return OpEvent(event.name, event.state, update_ns, Source.WEBHOOK, event.details)
