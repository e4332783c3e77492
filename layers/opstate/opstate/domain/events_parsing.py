"""What every event normaliser shares: the event shape's refusals and sources, and the parsing
of names, times and fields of duck-typed inputs (``opstate.domain.events`` describes the
normalisers; pure, like the whole domain).

Two kinds of refusal:
- ``InvalidEventError`` (``code`` = ``invalid-body``, ``missing-field``, ``invalid-name``,
  ``invalid-time``, ``invalid-state``, ``invalid-details``): the input is malformed; answer
  400 and write nothing.
- ``UnsupportedEventError`` (``reason`` = ``unsupported-event-type`` or ``unknown-state``): a
  well-formed input that this system deliberately does not turn into a state (a source added a
  type or state). It must never roll anything back; webhooks answer 200 with ``applied: false``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from opstate.domain.model import OpEvent
from opstate.domain.names import VIDEO_DETAIL, InvalidNameError, Kind, ParsedName, parse_name
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


def field(obj: Any, *keys: str) -> Any:
    """The first present, non-None value among ``keys`` of a mapping or an object."""
    for key in keys:
        value = obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)
        if value is not None:
            return value
    return None


def key_of(raw: object, hint: Kind | None) -> str:
    """The canonical key of the operation name ``raw`` (``parsed_name``)."""
    return parsed_name(raw, hint).key


def parsed_name(raw: object, hint: Kind | None) -> ParsedName:
    """The operation name ``raw`` parsed with ``hint``; none or an invalid one is
    ``InvalidEventError`` (``missing-field``, ``invalid-name``)."""
    if raw is None:
        raise InvalidEventError("missing-field", "no operation name ('name' or 'id')")
    try:
        return parse_name(raw, hint)
    except InvalidNameError as exc:
        raise InvalidEventError("invalid-name", str(exc)) from None


def with_model(details: dict[str, Any], parsed: ParsedName) -> dict[str, Any]:
    """Keep a video name's model (``details.model``): polling needs it to rebuild the name."""
    if parsed.model is not None:
        details[VIDEO_DETAIL] = parsed.model
    return details


def event_time(raw: object) -> int:
    """An event time, strict RFC3339 (text or an aware ``datetime``); none is 0 (unknown), any
    other value ``InvalidEventError`` ``invalid-time``."""
    if raw is None:
        return 0
    if not isinstance(raw, str | datetime):
        raise InvalidEventError("invalid-time", f"invalid time {raw!r}: expected RFC3339 text")
    try:
        return parse_time(raw)
    except InvalidTimeError as exc:
        raise InvalidEventError("invalid-time", str(exc)) from None


def sdk_time(raw: object) -> int:
    """A time read off a google-genai object or a REST resource read through its client: a
    naive ``datetime`` is UTC (the SDK parses Gemini's times, which are UTC, and drops a
    missing offset), and so is naive ISO text (the same time before the SDK parsed it); other
    text is parsed as RFC3339. Reports from producers stay strict (``event_time``)."""
    if isinstance(raw, datetime) and raw.utcoffset() is None:
        raw = raw.replace(tzinfo=UTC)
    elif isinstance(raw, str) and _naive_iso(raw):
        raw = raw + "Z"
    return event_time(raw)


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


def enum_text(value: Any) -> str:
    """The text of an enum member or a string (``JobState.JOB_STATE_RUNNING`` -> its value)."""
    text = getattr(value, "value", value)
    return str(text)
