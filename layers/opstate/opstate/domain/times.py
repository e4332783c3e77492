"""Exact instants as integer nanoseconds since the Unix epoch, UTC.

RFC3339 strings must never be compared as text: ``"...00.5Z" < "...00Z"`` as strings, and
offsets make equal instants look different. Every time that enters the system is parsed here
into an ``int`` of nanoseconds; 0 means "no server time" and is older than any real time.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

NS_PER_SECOND = 1_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The latest instant format_time can render (datetime's own limit).
MAX_NS = (
    ((datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC) - _EPOCH) // timedelta(seconds=1))
    * NS_PER_SECOND
    + NS_PER_SECOND
    - 1
)
# The latest instant a source may report. The last second before MAX_NS is kept free: a record's
# time only ever grows, and the previous release's reconciler wrote not-found markers at its
# record's time + 1 ns, so a record it stored above MAX_EVENT_NS still renders (and OpEvent
# refuses any time past MAX_NS, so nothing unrenderable is ever stored).
MARKER_ROOM_NS = NS_PER_SECOND
MAX_EVENT_NS = MAX_NS - MARKER_ROOM_NS
_TOO_LATE = "after 9999-12-31T23:59:58.999999999Z (the last second is reserved)"

_RFC3339 = re.compile(
    r"(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})"
    r"[Tt](?P<hour>\d{2}):(?P<minute>\d{2}):(?P<second>\d{2})"
    r"(?:\.(?P<frac>\d+))?"
    r"(?P<tz>[Zz]|(?P<sign>[+-])(?P<oh>\d{2}):(?P<om>\d{2}))",
    re.ASCII,
)


class InvalidTimeError(ValueError):
    """A value that is not an exact, timezone-aware instant."""

    def __init__(self, value: object, why: str) -> None:
        super().__init__(f"invalid time {value!r}: {why}")
        self.value = value
        self.why = why


def parse_time(value: str | datetime) -> int:
    """Nanoseconds since the epoch (UTC) of an RFC3339 text or an aware ``datetime``.

    Accepts 0 to 9 fractional digits, ``Z``/``z`` or ``+HH:MM``/``-HH:MM`` offsets and a
    ``T``/``t`` separator. Raises ``InvalidTimeError`` naming the value for anything else:
    naive datetimes, more than 9 fractional digits, impossible dates, out-of-range offsets,
    instants before the epoch, garbage.
    """
    if isinstance(value, datetime):
        return _from_datetime(value)
    if not isinstance(value, str):
        raise InvalidTimeError(value, "expected an RFC3339 string or a timezone-aware datetime")
    m = _RFC3339.fullmatch(value)
    if m is None:
        raise InvalidTimeError(value, "not an RFC3339 date-time (YYYY-MM-DDTHH:MM:SS[.f]Z|±HH:MM)")
    frac = m.group("frac") or ""
    if len(frac) > 9:
        raise InvalidTimeError(value, "more than 9 fractional digits")
    seconds = _wall_seconds(value, m) - _offset_minutes(value, m) * 60
    return _in_range(value, seconds * NS_PER_SECOND + int(frac.ljust(9, "0") or "0"))


def _offset_minutes(value: str, m: re.Match[str]) -> int:
    """The match's UTC offset in minutes (east positive); 0 for ``Z``."""
    if m.group("sign") is None:
        return 0
    oh, om = int(m.group("oh")), int(m.group("om"))
    if oh > 23 or om > 59:
        raise InvalidTimeError(value, "offset out of range")
    minutes = oh * 60 + om
    return -minutes if m.group("sign") == "-" else minutes


def _wall_seconds(value: str, m: re.Match[str]) -> int:
    """Whole seconds since the epoch of the match's wall-clock date and time, read as UTC."""
    try:
        wall = datetime(
            int(m.group("year")),
            int(m.group("month")),
            int(m.group("day")),
            int(m.group("hour")),
            int(m.group("minute")),
            int(m.group("second")),
            tzinfo=UTC,
        )
    except ValueError as exc:
        raise InvalidTimeError(value, f"impossible date or time ({exc})") from None
    return (wall - _EPOCH) // timedelta(seconds=1)


def _in_range(value: str | datetime, ns: int) -> int:
    """``ns`` if a source may report it (the epoch to ``MAX_EVENT_NS``), else an error."""
    if ns < 0:
        raise InvalidTimeError(value, "before 1970-01-01T00:00:00Z")
    if ns > MAX_EVENT_NS:
        raise InvalidTimeError(value, _TOO_LATE)
    return ns


def _from_datetime(value: datetime) -> int:
    offset = value.utcoffset()
    if offset is None:
        raise InvalidTimeError(value, "naive datetime (no timezone)")
    delta = value - _EPOCH
    return _in_range(
        value, (delta.days * 86_400 + delta.seconds) * NS_PER_SECOND + delta.microseconds * 1_000
    )


def check_ns(ns: int) -> int:
    """``ns`` itself if it is an int of nanoseconds that ``format_time`` can render (0 to
    ``MAX_NS``); ``InvalidTimeError`` otherwise."""
    if not isinstance(ns, int) or isinstance(ns, bool) or ns < 0 or ns > MAX_NS:
        raise InvalidTimeError(ns, "expected an int of nanoseconds between 0 and year 9999")
    return ns


def format_time(ns: int) -> str:
    """The canonical text of an instant: ``YYYY-MM-DDTHH:MM:SS.fffffffffZ``."""
    seconds, frac = divmod(check_ns(ns), NS_PER_SECOND)
    # time.gmtime: a third of the cost of a datetime; years 1970-9999 are four digits either way.
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(seconds))}.{frac:09d}Z"
