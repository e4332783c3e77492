"""What a Gemini refusal means for a retry (issue 39; docs/retry.md, "Refusals"). Pure: no SDK,
no clock, no I/O.

A failed row (``{"key", "error": google.rpc.Status}``) and a refused ``batches.create`` carry
the same ``google.rpc.Status``: a ``code`` (HTTP or gRPC), a ``status`` name, a ``message`` and
``details``. ``refusal_of`` reads it, the structured ``details`` first, and says one of:

- ``PASSING`` (a rate limit: the same request succeeds later): a ``google.rpc.RetryInfo``
  (its ``retryDelay`` is kept), a ``google.rpc.QuotaFailure`` whose quota is per minute, an
  ``ErrorInfo`` ``RATE_LIMIT_EXCEEDED``; without details, any ``RESOURCE_EXHAUSTED`` whose
  message names no money refusal, Gemini's standard sentence "You exceeded your current quota,
  please check your plan and billing details" included (it is what the per-minute limit and a
  full batch queue answer);
- ``DAILY``: a ``QuotaFailure`` whose quota is per day: passing after the reset, at midnight
  Pacific time (ai.google.dev/gemini-api/docs/rate-limits: "Requests per day (RPD) quotas
  reset at midnight Pacific time."), ``next_pacific_midnight_s``;
- ``MONEY`` (the account cannot pay; retrying is refused again until a person acts): HTTP 402,
  an ``ErrorInfo`` ``BILLING_DISABLED``, or a message naming depleted prepayment credits, a
  spending cap or billing that is not enabled;
- ``OTHER``: none of these (the code decides, as before).

``sanitize_details`` keeps what the rules read of ``details``, bounded (entries, violations,
characters) and of plain JSON types only, so a row or a stored refusal never carries more.
``backoff_s`` is how long a create refused as passing waits before it is tried again.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

PASSING = "passing"
DAILY = "daily"
MONEY = "money"
OTHER = "other"

QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
KEPT_TYPES = (QUOTA_FAILURE, RETRY_INFO, ERROR_INFO)
# Bounds of what is kept of an error's details.
MAX_DETAILS = 8
MAX_VIOLATIONS = 8
MAX_DETAIL_CHARS = 200
# The longest retry delay believed (a day and an hour: a per-day quota resets within a day).
MAX_DELAY_S = 90_000.0
# Bounded exponential backoff of a create refused as passing with no delay given.
BACKOFF_BASE_S = 60.0
BACKOFF_MAX_S = 3600.0

# ErrorInfo reasons that name money (google.rpc ErrorInfo of a project whose billing is off:
# "reason": "BILLING_DISABLED", e.g. github.com/GoogleCloudPlatform/php-docs-samples/issues/1235).
_MONEY_REASONS = frozenset({"BILLING_DISABLED", "UREQ_PROJECT_BILLING_NOT_FOUND"})
_RATE_REASONS = frozenset({"RATE_LIMIT_EXCEEDED"})
# The words of a money refusal: "Your prepayment credits are depleted." (429, then 402),
# Google's error page "Prepay credit balance is depleted", a spending (spend) cap, billing
# disabled or required ("This API method requires billing to be enabled", "has billing
# disabled", "The billing account for the owning project is disabled").
_MONEY_WORDS = re.compile(
    r"prepay(?:ment)?\s+credits?\s+(?:balance\s+)?(?:is|are)\s+depleted"
    r"|spend(?:ing)?\s+cap"
    r"|billing\b[^.]{0,40}?\bdisabled"
    r"|requires\s+billing\s+to\s+be\s+enabled",
    re.IGNORECASE,
)
# "Please retry in 20.04466179s." (the message of a 429 that also carries RetryInfo)
_RETRY_IN = re.compile(r"retry in ([0-9]{1,6}(?:\.[0-9]{1,9})?)s\b", re.IGNORECASE)
_DURATION = re.compile(r"([0-9]{1,6}(?:\.[0-9]{1,9})?)s")
_PER_DAY = re.compile(r"per ?day", re.IGNORECASE)
_PER_MINUTE = re.compile(r"per ?minute", re.IGNORECASE)


class Refusal(StrEnum):
    PASSING = PASSING
    DAILY = DAILY
    MONEY = MONEY
    OTHER = OTHER


@dataclass(
    frozen=True,
    slots=True,  # mutant: equivalent — slots=False changes only the memory
)
class Verdict:
    """What a refusal means: its ``kind`` and the delay Gemini asked for (seconds), if any."""

    kind: Refusal
    delay_s: float | None = None


def _text(value: object) -> str | None:
    return value[:MAX_DETAIL_CHARS] if isinstance(value, str) else None


def _clean_violation(value: object) -> dict[str, str] | None:
    if not isinstance(value, Mapping):
        return None
    kept = {
        name: text
        for name in ("quotaMetric", "quotaId", "quotaValue")
        if (text := _text(value.get(name))) is not None
    }
    return kept or None


def _clean(detail: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = detail.get("@type")
    if kind == RETRY_INFO:
        delay = _text(detail.get("retryDelay"))
        return {"@type": kind, "retryDelay": delay} if delay is not None else None
    if kind == ERROR_INFO:
        reason = _text(detail.get("reason"))
        if reason is None:
            return None
        out: dict[str, Any] = {"@type": kind, "reason": reason}
        domain = _text(detail.get("domain"))
        if domain is not None:
            out["domain"] = domain
        metadata = detail.get("metadata")
        if isinstance(metadata, Mapping):
            limit = _text(metadata.get("quota_limit"))
            if limit is not None:
                out["metadata"] = {"quota_limit": limit}
        return out
    if kind == QUOTA_FAILURE:
        raw = detail.get("violations")
        violations = [
            clean
            for item in (raw if isinstance(raw, list) else [])[:MAX_VIOLATIONS]
            if (clean := _clean_violation(item)) is not None
        ]
        return {"@type": kind, "violations": violations} if violations else None
    return None


def sanitize_details(raw: object) -> list[dict[str, Any]]:
    """The parts of a ``google.rpc.Status``'s ``details`` the rules read: ``RetryInfo``
    (``retryDelay``), ``ErrorInfo`` (``reason``, ``domain``, ``metadata.quota_limit``) and
    ``QuotaFailure`` (each violation's ``quotaMetric``, ``quotaId``, ``quotaValue``); strings
    only, each cut to ``MAX_DETAIL_CHARS``, at most ``MAX_DETAILS`` entries of
    ``MAX_VIOLATIONS`` violations. Anything else (another type, a field of the wrong type, a
    ``details`` that is not a list) is left out."""
    if not isinstance(raw, list):
        return []
    kept: list[dict[str, Any]] = []
    for item in raw:
        if len(kept) == MAX_DETAILS:
            break
        if isinstance(item, Mapping):
            clean = _clean(item)
            if clean is not None:
                kept.append(clean)
    return kept


def duration_s(text: str) -> float | None:
    """A ``google.protobuf.Duration`` as JSON spells it (``"26s"``, ``"20.04s"``) in seconds,
    at most ``MAX_DELAY_S``; None when it is not one."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        return None
    return min(float(match.group(1)), MAX_DELAY_S)


def _quota_ids(detail: Mapping[str, Any]) -> list[str]:
    if detail.get("@type") == QUOTA_FAILURE:
        return [str(v.get("quotaId") or "") for v in detail.get("violations") or []]
    if detail.get("@type") == ERROR_INFO:
        metadata = detail.get("metadata")
        if isinstance(metadata, Mapping) and isinstance(metadata.get("quota_limit"), str):
            return [metadata["quota_limit"]]
    return []


def _from_details(details: Sequence[Mapping[str, Any]]) -> Verdict | None:
    delay: float | None = None
    per_day = per_minute = rate = False
    for detail in details:
        kind = detail.get("@type")
        if kind == ERROR_INFO and detail.get("reason") in _MONEY_REASONS:
            return Verdict(Refusal.MONEY)
        if kind == ERROR_INFO and detail.get("reason") in _RATE_REASONS:
            rate = True
        if kind == RETRY_INFO and isinstance(detail.get("retryDelay"), str):
            delay = duration_s(detail["retryDelay"])
        for quota in _quota_ids(detail):
            per_day = per_day or _PER_DAY.search(quota) is not None
            per_minute = per_minute or _PER_MINUTE.search(quota) is not None
    if per_day:  # a day's quota is spent: the minute's delay is not when it comes back
        return Verdict(Refusal.DAILY, delay)
    if per_minute or rate or delay is not None:
        return Verdict(Refusal.PASSING, delay)
    return None


def refusal_of(
    code: int | str | None,
    status: str | None,
    message: str,
    details: Sequence[Mapping[str, Any]] = (),
) -> Verdict:
    """What a ``google.rpc.Status`` (``code`` as HTTP or gRPC number, or text; ``status``
    name; ``message``; ``details`` as ``sanitize_details`` keeps them) means for a retry (see
    the module docstring). Money first (HTTP 402, then the details, then the words), then the
    details' quota and delay, then: a ``RESOURCE_EXHAUSTED`` (429 or gRPC 8) is passing."""
    text = str(code).strip()  # None and a bool read "None", "True": no code of the rules
    if text == "402":
        return Verdict(Refusal.MONEY)
    verdict = _from_details(details)
    if verdict is not None and verdict.kind is Refusal.MONEY:
        return verdict
    if _MONEY_WORDS.search(message) is not None:
        return Verdict(Refusal.MONEY)
    if verdict is not None:
        return verdict
    if text in ("429", "8") or status == "RESOURCE_EXHAUSTED":
        said = _RETRY_IN.search(message)
        return Verdict(Refusal.PASSING, min(float(said.group(1)), MAX_DELAY_S) if said else None)
    return Verdict(Refusal.OTHER)


def names_money(message: str) -> bool:
    """Whether ``message`` names a money refusal: depleted prepayment credits, a spending cap,
    billing disabled or required (Gemini's standard rate-limit sentence, which says "check
    your plan and billing details", does not)."""
    return _MONEY_WORDS.search(message) is not None


def backoff_s(refusals: int, delay_s: float | None) -> float:
    """How long a create refused as passing for the ``refusals``-th time in a row waits: the
    delay Gemini gave, else ``BACKOFF_BASE_S`` doubled per refusal before it; at most
    ``BACKOFF_MAX_S`` either way, at least 1 s."""
    if delay_s is not None:
        return min(max(delay_s, 1.0), BACKOFF_MAX_S)
    doublings = min(
        max(refusals - 1, 0),
        16,  # mutant: equivalent — 16 only keeps the power small: the cap is reached at 6
    )
    return min(BACKOFF_BASE_S * float(2**doublings), BACKOFF_MAX_S)


# -- midnight Pacific ---------------------------------------------------------------------------
# US Pacific time: UTC-8 (PST), UTC-7 (PDT) from the second Sunday of March, 02:00 local, to the
# first Sunday of November, 02:00 local (the rule since 2007). Written out rather than read from
# a time zone database, which a Lambda image need not carry.

_DAY_S = 86_400
_HOUR_S = 3600


def _nth_sunday_s(year: int, month: int, nth: int) -> int:
    """Midnight UTC of the ``nth`` Sunday of ``month`` (seconds since the epoch)."""
    first = calendar.weekday(year, month, 1)  # Monday is 0, Sunday is 6
    day = 1 + (6 - first) + 7 * (nth - 1)  # 6 - first: the days to the first Sunday
    return calendar.timegm((year, month, day, 0, 0, 0))


def pacific_offset_s(utc_s: float) -> int:
    """The Pacific time zone's offset from UTC at ``utc_s`` (seconds: -28800 or -25200)."""
    year = time_year(utc_s)
    dst_start = _nth_sunday_s(year, 3, 2) + 2 * _HOUR_S + 8 * _HOUR_S  # 02:00 PST
    dst_end = _nth_sunday_s(year, 11, 1) + 2 * _HOUR_S + 7 * _HOUR_S  # 02:00 PDT
    return -7 * _HOUR_S if dst_start <= utc_s < dst_end else -8 * _HOUR_S


def time_year(utc_s: float) -> int:
    """The UTC calendar year of ``utc_s``."""
    return time.gmtime(utc_s).tm_year


def next_pacific_midnight_s(utc_s: float) -> float:
    """The first midnight Pacific time after ``utc_s`` (seconds since the epoch), when a
    per-day Gemini quota resets."""
    local = utc_s + pacific_offset_s(utc_s)
    midnight_local = (int(local // _DAY_S) + 1) * _DAY_S
    # The offset at that midnight: read at a UTC instant within a day before it (a DST change
    # happens at 02:00 local, never between the day before's 08:00 and midnight).
    guess = (
        midnight_local  # mutant: equivalent — + and - 8 hours read the same offset (above)
        + 8 * _HOUR_S
    )
    return float(midnight_local - pacific_offset_s(guess))
