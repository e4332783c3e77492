"""parse_time / format_time: exact instants as integer nanoseconds since the epoch, UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone, tzinfo

import pytest

from opstate.domain.times import (
    MARKER_ROOM_NS,
    MAX_EVENT_NS,
    MAX_NS,
    NS_PER_SECOND,
    InvalidTimeError,
    format_time,
    parse_time,
)

# 2026-01-01T00:00:00Z in seconds since the epoch.
T2026 = 1_767_225_600
BASE = T2026 * NS_PER_SECOND


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # 0..9 fractional digits, each digit at its place value
        ("2026-01-01T00:00:00Z", BASE),
        ("2026-01-01T00:00:00.5Z", BASE + 500_000_000),
        ("2026-01-01T00:00:00.12Z", BASE + 120_000_000),
        ("2026-01-01T00:00:00.123Z", BASE + 123_000_000),
        ("2026-01-01T00:00:00.1234Z", BASE + 123_400_000),
        ("2026-01-01T00:00:00.12345Z", BASE + 123_450_000),
        ("2026-01-01T00:00:00.123456Z", BASE + 123_456_000),
        ("2026-01-01T00:00:00.1234567Z", BASE + 123_456_700),
        ("2026-01-01T00:00:00.12345678Z", BASE + 123_456_780),
        ("2026-01-01T00:00:00.123456789Z", BASE + 123_456_789),
        ("2026-01-01T00:00:00.000000001Z", BASE + 1),
        ("2026-01-01T00:00:00.0Z", BASE),
        ("2026-01-01T00:00:00.000000000Z", BASE),
        # lower-case separator and zone designator
        ("2026-01-01t00:00:00z", BASE),
        ("2026-01-01t00:00:00.5Z", BASE + 500_000_000),
        ("2026-01-01T00:00:00.5z", BASE + 500_000_000),
        # offsets
        ("2026-01-01T09:00:00+09:00", BASE),
        ("2025-12-31T19:00:00-05:00", BASE),
        ("2026-01-01T05:30:00.25+05:30", BASE + 250_000_000),
        ("2026-01-01T00:00:00+00:00", BASE),
        ("2026-01-01T00:00:00-00:00", BASE),
        ("2026-01-01T23:59:00+23:59", BASE),
        ("2025-12-31T00:01:00-23:59", BASE),
        # leap day, epoch, the last representable instant
        ("2024-02-29T12:00:00Z", 1_709_208_000 * NS_PER_SECOND),
        ("1970-01-01T00:00:00Z", 0),
        ("1970-01-01T00:00:00.000000001Z", 1),
        ("9999-12-31T23:59:58.999999999Z", MAX_EVENT_NS),
    ],
)
def test_parse_time_accepts_rfc3339(text: str, expected: int) -> None:
    assert parse_time(text) == expected


def test_fraction_is_later_than_the_whole_second() -> None:
    # The seed compared text: "…00.5Z" < "…00Z" as strings, yet it is half a second later.
    assert "2026-01-01T00:00:00.5Z" < "2026-01-01T00:00:00Z"
    assert parse_time("2026-01-01T00:00:00.5Z") > parse_time("2026-01-01T00:00:00Z")
    assert parse_time("2026-01-01T00:00:00.5Z") - parse_time("2026-01-01T00:00:00Z") == (
        NS_PER_SECOND // 2
    )


def test_offset_spelling_of_the_same_instant_is_equal() -> None:
    tokyo, utc = "2026-01-01T09:00:00+09:00", "2026-01-01T00:00:00Z"
    assert parse_time(tokyo) == parse_time(utc)
    # and text order is not instant order across offsets
    assert "2026-01-01T08:00:00+09:00" > "2026-01-01T00:00:00Z"
    assert parse_time("2026-01-01T08:00:00+09:00") < parse_time("2026-01-01T00:00:00Z")


class _FixedZone(tzinfo):
    """A non-stdlib aware tzinfo (like dateutil's), to show any aware datetime is accepted."""

    def utcoffset(self, dt: datetime | None) -> timedelta:
        return timedelta(hours=-3)

    def dst(self, dt: datetime | None) -> timedelta:
        return timedelta(0)

    def tzname(self, dt: datetime | None) -> str:
        return "X-3"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (datetime(2026, 1, 1, tzinfo=UTC), BASE),
        (datetime(2026, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC), BASE + 500_000_000),
        (datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC), BASE + 1_000),
        (datetime(2026, 1, 1, 9, tzinfo=timezone(timedelta(hours=9))), BASE),
        (datetime(2025, 12, 31, 21, tzinfo=_FixedZone()), BASE),
        (datetime(1970, 1, 1, tzinfo=UTC), 0),
    ],
)
def test_parse_time_accepts_aware_datetimes(value: datetime, expected: int) -> None:
    assert parse_time(value) == expected


def test_parse_time_accepts_what_google_genai_returns() -> None:
    # google-genai (pydantic) turns "…Z" timestamps into aware datetimes.
    from google.genai import types

    job = types.BatchJob.model_validate(
        {"name": "batches/x", "update_time": "2026-01-01T00:00:00.123456Z"}
    )
    assert job.update_time is not None
    assert job.update_time.utcoffset() is not None
    assert parse_time(job.update_time) == BASE + 123_456_000


@pytest.mark.parametrize(
    "value",
    [
        # more than 9 fractional digits
        "2026-01-01T00:00:00.1234567890Z",
        # impossible dates and times
        "2026-02-30T00:00:00Z",
        "2025-02-29T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "2026-00-10T00:00:00Z",
        "2026-01-00T00:00:00Z",
        "2026-01-01T24:00:00Z",
        "2026-01-01T00:60:00Z",
        "2026-01-01T00:00:61Z",
        "2016-12-31T23:59:60Z",  # leap seconds are not representable
        # out-of-range offsets
        "2026-01-01T00:00:00+24:00",
        "2026-01-01T00:00:00-24:00",
        "2026-01-01T00:00:00+05:60",
        # no zone, malformed zone, malformed layout
        "2026-01-01T00:00:00",
        "2026-01-01T00:00:00+0900",
        "2026-01-01T00:00:00+9:00",
        "2026-01-01T00:00:00 Z",
        "2026-01-01 00:00:00Z",
        "2026-01-01T00:00Z",
        "2026-01-01T00:00:00.Z",
        "2026-1-01T00:00:00Z",
        "26-01-01T00:00:00Z",
        " 2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00Z\n",
        "2026-01-01",
        # non-ASCII digits
        "\uff12\uff10\uff12\uff16-01-01T00:00:00Z",
        # garbage
        "",
        "yesterday",
        "null",
        # outside the representable range
        "1969-12-31T23:59:59.999999999Z",
        "1970-01-01T00:00:00+00:01",
        "9999-12-31T23:59:59-00:01",
    ],
)
def test_parse_time_rejects_bad_text_naming_the_value(value: str) -> None:
    with pytest.raises(InvalidTimeError) as info:
        parse_time(value)
    assert info.value.value == value
    assert repr(value) in str(info.value)
    assert info.value.why


@pytest.mark.parametrize(
    "value",
    [
        None,
        0,
        1_767_225_600,
        1_767_225_600.5,
        True,
        b"2026-01-01T00:00:00Z",
        ["2026-01-01T00:00:00Z"],
        {"seconds": 1},
    ],
)
def test_parse_time_rejects_non_strings(value: object) -> None:
    with pytest.raises(InvalidTimeError) as info:
        parse_time(value)  # type: ignore[arg-type]
    assert info.value.value is value
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 1, 1),
        datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-1))),
    ],
)
def test_parse_time_rejects_naive_or_out_of_range_datetimes(value: datetime) -> None:
    with pytest.raises(InvalidTimeError) as info:
        parse_time(value)
    assert info.value.value is value


def test_naive_datetime_error_says_naive() -> None:
    with pytest.raises(InvalidTimeError, match="naive"):
        parse_time(datetime(2026, 1, 1))


def test_invalid_time_error_is_a_value_error() -> None:
    assert issubclass(InvalidTimeError, ValueError)


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "1970-01-01T00:00:00.000000000Z"),
        (1, "1970-01-01T00:00:00.000000001Z"),
        (BASE, "2026-01-01T00:00:00.000000000Z"),
        (BASE + 500_000_000, "2026-01-01T00:00:00.500000000Z"),
        (BASE + 123_456_789, "2026-01-01T00:00:00.123456789Z"),
        (1_709_208_000 * NS_PER_SECOND, "2024-02-29T12:00:00.000000000Z"),
        (MAX_EVENT_NS, "9999-12-31T23:59:58.999999999Z"),
    ],
)
def test_format_time_is_canonical(ns: int, text: str) -> None:
    assert format_time(ns) == text
    assert parse_time(text) == ns


def test_the_last_renderable_instant_renders_but_never_enters() -> None:
    # Records the previous release stored may sit above MAX_EVENT_NS (its not-found markers,
    # +1 ns each); no source may report a time in the reserved last second.
    assert format_time(MAX_NS) == "9999-12-31T23:59:59.999999999Z"
    assert MAX_NS - MAX_EVENT_NS == MARKER_ROOM_NS == NS_PER_SECOND
    for text in ("9999-12-31T23:59:59.999999999Z", "9999-12-31T23:59:59Z"):
        with pytest.raises(InvalidTimeError, match="the last second is reserved"):
            parse_time(text)
    with pytest.raises(InvalidTimeError, match="reserved"):
        parse_time(datetime(9999, 12, 31, 23, 59, 59, 1, tzinfo=UTC))


def test_canonical_text_sorts_like_instants() -> None:
    # The canonical form (fixed width, 9 digits, Z) is the one text that does sort correctly.
    instants = [BASE + 500_000_000, BASE, BASE + 1, 0, MAX_NS, BASE - 1]
    assert sorted(instants) == sorted(instants, key=format_time)


@pytest.mark.parametrize("ns", [-1, MAX_NS + 1, 1.5, "0", None, True])
def test_format_time_rejects_non_instants(ns: object) -> None:
    with pytest.raises(InvalidTimeError):
        format_time(ns)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "invalid time 'soon': not an RFC3339 date-time (YYYY-MM-DDTHH:MM:SS[.f]Z|±HH:MM)"),
        (
            "2026-01-01T00:00:00.1234567891Z",
            "invalid time '2026-01-01T00:00:00.1234567891Z': more than 9 fractional digits",
        ),
        (
            "2026-01-01T00:00:00+24:00",
            "invalid time '2026-01-01T00:00:00+24:00': offset out of range",
        ),
        (
            "2026-02-30T00:00:00Z",
            "invalid time '2026-02-30T00:00:00Z': impossible date or time (day is out of range "
            "for month)",
        ),
        (
            "1969-12-31T23:59:59Z",
            "invalid time '1969-12-31T23:59:59Z': before 1970-01-01T00:00:00Z",
        ),
        (
            "9999-12-31T23:59:59Z",
            "invalid time '9999-12-31T23:59:59Z': after 9999-12-31T23:59:58.999999999Z (the last "
            "second is reserved)",
        ),
        (5, "invalid time 5: expected an RFC3339 string or a timezone-aware datetime"),
    ],
)
def test_time_error_messages_users_see(value: object, message: str) -> None:
    with pytest.raises(InvalidTimeError) as info:
        parse_time(value)  # type: ignore[arg-type]
    assert str(info.value) == message
    assert info.value.value == value and info.value.why in message


def test_datetime_and_ns_error_messages() -> None:
    naive = datetime(2026, 1, 1)
    with pytest.raises(InvalidTimeError) as info:
        parse_time(naive)
    assert str(info.value) == f"invalid time {naive!r}: naive datetime (no timezone)"
    early = datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)
    with pytest.raises(InvalidTimeError) as info:
        parse_time(early)
    assert str(info.value) == f"invalid time {early!r}: before 1970-01-01T00:00:00Z"
    with pytest.raises(InvalidTimeError) as info:
        format_time(-1)
    assert str(info.value) == (
        "invalid time -1: expected an int of nanoseconds between 0 and year 9999"
    )
