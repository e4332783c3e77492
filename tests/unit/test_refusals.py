"""What a refusal means for a retry (opstate.domain.refusals, issue 39): the details kept, the
verdict (details first, then 402, then the words), the backoff and midnight Pacific. The real
bodies behind these rules: tests/fixtures/gemini_errors (tests/unit/test_gemini_errors.py)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from opstate.domain import refusals as r
from opstate.domain.refusals import (
    DAILY,
    ERROR_INFO,
    MONEY,
    OTHER,
    PASSING,
    QUOTA_FAILURE,
    RETRY_INFO,
    Verdict,
    backoff_s,
    duration_s,
    names_money,
    next_pacific_midnight_s,
    pacific_offset_s,
    refusal_of,
    sanitize_details,
)

# The bounds docs/retry.md gives (written out: a test reading the constants would follow them)
MAX_DETAILS = 8
MAX_VIOLATIONS = 8
MAX_DETAIL_CHARS = 200
MAX_DELAY_S = 90_000.0  # 25 h
BACKOFF_BASE_S = 60.0
BACKOFF_MAX_S = 3600.0
PER_MINUTE = "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"
PER_DAY = "GenerateRequestsPerDayPerProjectPerModel-FreeTier"
STANDARD = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits."
)


def quota(*ids: str) -> dict[str, Any]:
    return {"@type": QUOTA_FAILURE, "violations": [{"quotaId": i} for i in ids]}


def retry(delay: str) -> dict[str, Any]:
    return {"@type": RETRY_INFO, "retryDelay": delay}


def info(reason: str, **metadata: str) -> dict[str, Any]:
    out: dict[str, Any] = {"@type": ERROR_INFO, "reason": reason}
    if metadata:
        out["metadata"] = metadata
    return out


# -- sanitize_details -----------------------------------------------------------------------


def test_sanitize_keeps_only_what_the_rules_read() -> None:
    raw = [
        {"@type": "type.googleapis.com/google.rpc.Help", "links": [{"url": "x"}]},
        {
            "@type": QUOTA_FAILURE,
            "violations": [
                {
                    "quotaMetric": "m",
                    "quotaId": PER_MINUTE,
                    "quotaDimensions": {"model": "g"},
                    "quotaValue": "250",
                    "extra": "dropped",
                },
                {"quotaDimensions": {"model": "g"}},  # nothing kept of it: left out
                "not a violation",
                {"quotaId": 7, "quotaMetric": "only this"},
            ],
        },
        {"@type": RETRY_INFO, "retryDelay": "26s", "other": 1},
        {"@type": RETRY_INFO, "retryDelay": 26},  # not a string: left out
        {
            "@type": ERROR_INFO,
            "reason": "RATE_LIMIT_EXCEEDED",
            "domain": "googleapis.com",
            "metadata": {"quota_limit": "PerMinute", "consumer": "projects/1"},
        },
        {"@type": ERROR_INFO, "domain": "googleapis.com"},  # no reason: left out
        {"@type": ERROR_INFO, "reason": "X", "domain": 3, "metadata": {"quota_limit": 4}},
        {"@type": ERROR_INFO, "reason": "Y", "metadata": ["quota_limit"]},
        {"@type": QUOTA_FAILURE, "violations": "none"},
        {"@type": QUOTA_FAILURE, "violations": [{}]},
        "a string",
        {"@type": 1, "data": "type.googleapis.com/google.rpc.ErrorInfo"},
    ]
    assert sanitize_details(raw) == [
        {
            "@type": QUOTA_FAILURE,
            "violations": [
                {"quotaMetric": "m", "quotaId": PER_MINUTE, "quotaValue": "250"},
                {"quotaMetric": "only this"},
            ],
        },
        {"@type": RETRY_INFO, "retryDelay": "26s"},
        {
            "@type": ERROR_INFO,
            "reason": "RATE_LIMIT_EXCEEDED",
            "domain": "googleapis.com",
            "metadata": {"quota_limit": "PerMinute"},
        },
        {"@type": ERROR_INFO, "reason": "X"},
        {"@type": ERROR_INFO, "reason": "Y"},
    ]
    for not_a_list in (None, {"@type": RETRY_INFO}, "details", 3):
        assert sanitize_details(not_a_list) == []


def test_sanitize_is_bounded() -> None:
    long = "x" * (MAX_DETAIL_CHARS + 50)
    many = [retry(f"{i}s") for i in range(MAX_DETAILS + 3)]
    assert sanitize_details(many) == many[:MAX_DETAILS]
    assert len(sanitize_details([{"@type": "other"}] * 3 + many)) == MAX_DETAILS
    violations = [{"quotaId": str(i)} for i in range(MAX_VIOLATIONS + 4)]
    (kept,) = sanitize_details([{"@type": QUOTA_FAILURE, "violations": violations}])
    assert kept["violations"] == violations[:MAX_VIOLATIONS]
    (cut,) = sanitize_details([info(long)])
    assert cut["reason"] == "x" * MAX_DETAIL_CHARS
    exact = "y" * MAX_DETAIL_CHARS
    assert sanitize_details([info(exact)])[0]["reason"] == exact


# -- the verdict ------------------------------------------------------------------------------


def test_sanitize_reads_no_more_entries_than_it_keeps() -> None:
    class Trap(list[Any]):
        """A details list whose entries past the cap must not be looked at."""

        def __iter__(self) -> Any:
            for index, item in enumerate(list.__iter__(self)):
                if index > MAX_DETAILS:
                    raise AssertionError("read past the cap")
                yield item

    assert len(sanitize_details(Trap([retry("1s")] * (MAX_DETAILS + 5)))) == MAX_DETAILS


def test_a_verdict_is_a_value() -> None:
    verdict = Verdict(r.Refusal.PASSING, 26.0)
    assert verdict == Verdict(r.Refusal.PASSING, 26.0) and hash(verdict) == hash(
        Verdict(r.Refusal.PASSING, 26.0)
    )
    with pytest.raises(AttributeError):
        verdict.delay_s = 1.0  # type: ignore[misc]


def test_only_a_retry_info_gives_a_delay() -> None:
    # refusal_of reads what sanitize_details keeps; given more, a retryDelay elsewhere is no delay
    stray = [{"@type": ERROR_INFO, "reason": "X", "retryDelay": "5s"}]
    assert refusal_of(400, None, "", stray) == Verdict(r.Refusal.OTHER)
    assert refusal_of(400, None, "", [{"@type": RETRY_INFO, "retryDelay": 5}]) == Verdict(
        r.Refusal.OTHER
    )


def test_duration() -> None:
    assert duration_s("26s") == 26.0
    assert duration_s(" 20.04466179s ") == pytest.approx(20.04466179)
    assert duration_s("0s") == 0.0
    assert duration_s(f"{int(MAX_DELAY_S) + 5}s") == MAX_DELAY_S
    for bad in ("26", "s", "1m", "26s extra", "-3s", ""):
        assert duration_s(bad) is None


@pytest.mark.parametrize(
    ("details", "verdict"),
    [
        ([quota(PER_MINUTE)], Verdict(r.Refusal.PASSING)),
        ([quota(PER_MINUTE), retry("26s")], Verdict(r.Refusal.PASSING, 26.0)),
        ([retry("59s")], Verdict(r.Refusal.PASSING, 59.0)),
        ([retry("soon")], None),  # a delay that is not one says nothing
        ([info("RATE_LIMIT_EXCEEDED")], Verdict(r.Refusal.PASSING)),
        ([info("SOMETHING_ELSE")], None),
        (
            [info("X", quota_limit="GenerateContentRequestsPerMinutePerProjectPerRegion")],
            Verdict(r.Refusal.PASSING),
        ),
        ([info("X", quota_limit="RequestsPerDay")], Verdict(r.Refusal.DAILY)),
        ([quota(PER_DAY), retry("22s")], Verdict(r.Refusal.DAILY, 22.0)),
        # a day's quota spent with a minute's too: the day decides, whatever the order
        ([quota(PER_MINUTE, PER_DAY)], Verdict(r.Refusal.DAILY)),
        ([quota(PER_DAY, PER_MINUTE)], Verdict(r.Refusal.DAILY)),
        ([quota(PER_MINUTE), quota(PER_DAY)], Verdict(r.Refusal.DAILY)),
        (
            [quota("GenerateContentInputTokensPerModelPerMinute-FreeTier")],
            Verdict(r.Refusal.PASSING),
        ),
        ([quota("SomethingElse")], None),
        ([info("BILLING_DISABLED"), quota(PER_MINUTE)], Verdict(r.Refusal.MONEY)),
        ([quota(PER_MINUTE), info("BILLING_DISABLED")], Verdict(r.Refusal.MONEY)),
        ([retry("5s"), info("UREQ_PROJECT_BILLING_NOT_FOUND")], Verdict(r.Refusal.MONEY)),
        ([], None),
    ],
)
def test_the_details_decide_first(details: list[dict[str, Any]], verdict: Verdict | None) -> None:
    # a 429 whose message alone would pass, and one whose message names nothing at all
    expected = verdict or Verdict(r.Refusal.PASSING)
    assert refusal_of(429, "RESOURCE_EXHAUSTED", STANDARD, details) == expected
    assert refusal_of("429", None, "", details) == expected
    assert refusal_of(400, "INVALID_ARGUMENT", "bad", details) == (
        verdict or Verdict(r.Refusal.OTHER)
    )


def test_money_comes_first() -> None:
    depleted = "Your prepayment credits are depleted. Please go to AI Studio."
    for code in (402, "402", " 402 "):
        assert refusal_of(code, None, "", [retry("26s")]).kind == MONEY
    assert refusal_of(429, "RESOURCE_EXHAUSTED", depleted, [retry("26s")]).kind == MONEY
    assert refusal_of(429, "RESOURCE_EXHAUSTED", depleted, [quota(PER_DAY)]).kind == MONEY
    assert refusal_of(403, "PERMISSION_DENIED", "Project p has billing disabled.").kind == MONEY
    assert refusal_of(None, None, "spending cap reached").kind == MONEY
    # a status that is no number and a bool are no code
    assert refusal_of(True, None, "").kind == OTHER
    assert refusal_of(None, None, "").kind == OTHER
    assert refusal_of("RESOURCE_EXHAUSTED", None, "").kind == OTHER


def test_a_resource_exhausted_without_details_passes_with_the_delay_it_names() -> None:
    for code, status in ((429, None), (8, None), ("8", None), (None, "RESOURCE_EXHAUSTED")):
        assert refusal_of(code, status, STANDARD) == Verdict(r.Refusal.PASSING)
    said = STANDARD + " Please retry in 20.04466179s."
    verdict = refusal_of(429, "RESOURCE_EXHAUSTED", said)
    assert verdict.kind == PASSING and verdict.delay_s == pytest.approx(20.04466179)
    assert refusal_of(429, None, "please RETRY IN 7s").delay_s == 7.0
    assert refusal_of(429, None, f"retry in {int(MAX_DELAY_S) * 2}s").delay_s == MAX_DELAY_S
    assert refusal_of(429, None, "retry in 7 seconds").delay_s is None
    # anything else is no refusal of the kinds above
    for code, status in ((503, "UNAVAILABLE"), (500, None), (4, None), (None, "ABORTED")):
        assert refusal_of(code, status, STANDARD) == Verdict(r.Refusal.OTHER)


@pytest.mark.parametrize(
    ("message", "money"),
    [
        ("Your prepayment credits are depleted.", True),
        ("Your Prepay credit balance is depleted.", True),
        ("prepayment credit is depleted", True),
        ("Your project has exceeded its monthly spending cap", True),
        ("spend cap", True),
        ("Project p (#1) has billing disabled. Please enable it.", True),
        ("Billing account is disabled", True),
        ("The billing account for the owning project is disabled in state absent", True),
        ("This API method requires billing to be enabled.", True),
        (STANDARD, False),
        ("Resource has been exhausted (e.g. check quota).", False),
        ("Quota exceeded for quota metric 'Batch enqueued tokens'", False),
        ("check your billing details. Disabled features", False),
        ("credits are fine", False),
        ("", False),
    ],
)
def test_names_money(message: str, money: bool) -> None:
    assert names_money(message) is money
    assert (refusal_of(429, None, message).kind == MONEY) is money


# -- the backoff ------------------------------------------------------------------------------


def test_backoff() -> None:
    assert [backoff_s(n, None) for n in (1, 2, 3, 4, 5, 6, 7, 50, 10**6)] == [
        BACKOFF_BASE_S,
        2 * BACKOFF_BASE_S,
        4 * BACKOFF_BASE_S,
        8 * BACKOFF_BASE_S,
        16 * BACKOFF_BASE_S,
        32 * BACKOFF_BASE_S,
        BACKOFF_MAX_S,
        BACKOFF_MAX_S,
        BACKOFF_MAX_S,
    ]
    assert backoff_s(0, None) == backoff_s(-3, None) == BACKOFF_BASE_S
    # Gemini's delay wins, bounded below by a second and above by the cap
    assert backoff_s(5, 26.0) == 26.0
    assert backoff_s(1, 0.0) == backoff_s(1, 0.5) == 1.0
    assert backoff_s(1, 1.0) == 1.0
    assert backoff_s(1, BACKOFF_MAX_S + 1) == BACKOFF_MAX_S
    assert backoff_s(1, BACKOFF_MAX_S) == BACKOFF_MAX_S


# -- midnight Pacific -------------------------------------------------------------------------

PACIFIC = ZoneInfo("America/Los_Angeles")


def by_the_database(utc_s: float) -> float:
    local = datetime.fromtimestamp(utc_s, PACIFIC)
    midnight = (local + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight.timestamp()


def utc(*fields: int) -> float:
    return datetime(*fields, tzinfo=UTC).timestamp()  # type: ignore[misc]


@pytest.mark.parametrize(
    "at",
    [
        utc(2026, 12, 6, 7, 59, 59),  # 23:59:59 PST
        utc(2026, 12, 6, 8, 0, 0),  # midnight PST: the next one is a day later
        utc(2026, 3, 8, 9, 59, 59),  # 01:59:59 PST, the day DST starts
        utc(2026, 3, 8, 10, 0, 0),  # 03:00 PDT
        utc(2026, 3, 8, 7, 0, 0),  # 23:00 PST the evening before
        utc(2026, 11, 1, 8, 59, 59),  # 01:59:59 PDT, the day DST ends
        utc(2026, 11, 1, 9, 0, 0),  # 01:00 PST
        utc(2026, 11, 1, 6, 30, 0),  # 23:30 PDT the evening before
        utc(2026, 7, 1, 6, 59, 59),
        utc(2026, 7, 1, 7, 0, 0),
        utc(2027, 1, 1, 0, 0, 0),  # new year in UTC, still the old one in Pacific
        utc(2028, 2, 29, 12, 0, 0),
    ],
)
def test_next_midnight_pacific_at_the_edges(at: float) -> None:
    assert next_pacific_midnight_s(at) == by_the_database(at)
    assert pacific_offset_s(at) == datetime.fromtimestamp(at, PACIFIC).utcoffset().total_seconds()  # type: ignore[union-attr]


def test_next_midnight_pacific_agrees_with_the_time_zone_database() -> None:
    rng = random.Random(39)
    for _ in range(3000):
        at = rng.uniform(utc(2007, 1, 1), utc(2099, 12, 31))
        assert next_pacific_midnight_s(at) == by_the_database(at), at
    assert next_pacific_midnight_s(utc(2026, 12, 6, 6, 0, 0)) == utc(2026, 12, 6, 8, 0, 0)
    assert DAILY == "daily" and PASSING == "passing" and MONEY == "money" and OTHER == "other"
