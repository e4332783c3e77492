"""How the ledger reads one row (pure): a token count, an error code, whether a response
carries no answer (``is_blocked``), a row's price band and model, and the lines of an inlined
output. ``opstate.outcomes.ledger`` counts with these and re-exports them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from opstate.outcomes.plan import BLOCKING_FINISH_REASONS, MAX_CODE_CHARS

USAGE_FIELDS = (
    "promptTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
    "cachedContentTokenCount",
    "toolUsePromptTokenCount",
    "totalTokenCount",
)
UNKNOWN_CODE = "unknown"
# The prompt sizes (tokens) above which a tiered Gemini price changes, every one genai-prices
# 0.2.5 lists for Google's models (a model whose tiers start elsewhere is not priced:
# ``opstate.outcomes.price`` checks). Band n: the prompt is over n of them.
PRICE_TIER_STARTS = (100_000, 128_000, 200_000)
# Different ``modelVersion``s kept apart; rows of any further one count under OTHER_MODEL.
MAX_BAND_MODELS = 8
MAX_MODEL_CHARS = 128
OTHER_MODEL = "other"
type BandKey = tuple[str | None, int]
# The largest token count read (an int64, as Gemini's proto declares them), and its digits.
MAX_COUNT = 2**63 - 1
_MAX_DIGITS = len(str(MAX_COUNT))
# The per-modality counts of a ``usageMetadata`` (issue 47), summed per band as genai-prices'
# own Google extractor reads them: each list's ``[{"modality", "tokenCount"}]``. A modality of
# any other name (``MODALITY_UNSPECIFIED``, a new one) counts as ``OTHER``, which is not priced.
DETAIL_FIELDS = (
    "promptTokensDetails",
    "candidatesTokensDetails",
    "cacheTokensDetails",
    "toolUsePromptTokensDetails",
)
MODALITIES = ("TEXT", "IMAGE", "AUDIO", "VIDEO", "DOCUMENT", "OTHER")
# (list, modality) of each per-modality sum, after the six of USAGE_FIELDS in a band's sums.
DETAIL_KEYS = tuple((d, m) for d in DETAIL_FIELDS for m in MODALITIES)
_MODALITY_AT = {m: i for i, m in enumerate(MODALITIES)}
_OTHER_AT = MODALITIES.index("OTHER")


class UnreadableRowError(ValueError):
    """A row the ledger cannot read (a token count or a modality list that is not one): the
    row is counted ``unreadable``, never the end of the archive."""


def _count(value: object) -> int:
    """A token count as JSON carries it: an int of ``0..MAX_COUNT``, or an int64 as decimal
    text (proto3's JSON form: ASCII digits only, at most ``MAX_COUNT``); missing or null is 0.
    Anything else (a bool, a float, a negative number, ``"²"``, 5,000 digits) raises
    ``UnreadableRowError``: the row is unreadable (issue 47)."""
    if value is None:
        return 0
    if type(value) is int:
        if 0 <= value <= MAX_COUNT:
            return value
    elif (
        type(value) is str
        and 0 < len(value) <= _MAX_DIGITS
        and value.isascii()
        and value.isdigit()
        and int(value) <= MAX_COUNT
    ):
        return int(value)
    raise UnreadableRowError(f"not a token count: {str(value)[:40]!r}")


def _details(value: object) -> list[tuple[int, int]]:
    """A ``*TokensDetails`` list (``[{"modality", "tokenCount"}]``) as (modality index in
    ``MODALITIES``, count) pairs; a modality of no other name counts as ``OTHER``. Missing or
    null is none; anything but a list of objects raises ``UnreadableRowError``."""
    if value is None:
        return []
    if type(value) is not list:
        raise UnreadableRowError("a modality list that is not a list")
    found = []
    for item in value:
        if type(item) is not dict:
            raise UnreadableRowError("a modality count that is not an object")
        modality = item.get("modality")
        index = _MODALITY_AT.get(modality, _OTHER_AT) if type(modality) is str else _OTHER_AT
        found.append((index, _count(item.get("tokenCount"))))
    return found


def usage_counts(usage: Mapping[str, Any]) -> list[int]:
    """A ``usageMetadata`` object's counts as a band sums them: ``USAGE_FIELDS``, then
    ``DETAIL_KEYS`` only when it has a per-modality list (``UnreadableRowError`` for a value
    that is no count). The usual count (an int in range, or none) is read inline."""
    counts = [
        0 if v is None else v if type(v) is int and 0 <= v <= MAX_COUNT else _count(v)
        for v in map(usage.get, USAGE_FIELDS)
    ]
    if usage.keys().isdisjoint(DETAIL_FIELDS):
        return counts
    counts.extend([0] * len(DETAIL_KEYS))
    for d, name in enumerate(DETAIL_FIELDS):
        base = len(USAGE_FIELDS) + d * len(MODALITIES)
        for index, n in _details(usage.get(name)):
            counts[base + index] += n
    return counts


def band_of(prompt: int) -> int:
    """How many of ``PRICE_TIER_STARTS`` a row's prompt size is over (its price band)."""
    return sum(prompt > start for start in PRICE_TIER_STARTS)


def _code(code: object) -> str:
    """The key a failed row's ``status.code`` is counted under (at most ``MAX_CODE_CHARS``)."""
    if isinstance(code, bool) or code is None:
        return UNKNOWN_CODE
    if isinstance(code, int | str) and str(code).strip():
        return str(code).strip()[:MAX_CODE_CHARS]
    return UNKNOWN_CODE


def is_blocked(response: Mapping[str, Any]) -> bool:
    """Whether a succeeded row's ``response`` (a JSON object) carries no answer: its
    ``promptFeedback.blockReason`` is a non-empty string (the prompt was blocked), or its
    ``candidates`` are missing, null or ``[]``, or every candidate is an object whose
    ``finishReason`` is one of ``BLOCKING_FINISH_REASONS``.

    A field of another type says nothing: a ``promptFeedback`` or ``blockReason`` that is not
    an object / a string is no block reason, and ``candidates`` that are not a list, or a
    candidate that is not an object or whose ``finishReason`` is not a string, are not blocked
    (the row stays succeeded and only succeeded)."""
    feedback = response.get("promptFeedback")
    if isinstance(feedback, dict):
        reason = feedback.get("blockReason")
        if isinstance(reason, str) and reason:
            return True
    candidates = response.get("candidates")
    if candidates is None:
        return True
    if not isinstance(candidates, list):
        return False
    for candidate in candidates:
        if not isinstance(candidate, dict):
            return False
        reason = candidate.get("finishReason")
        if not isinstance(reason, str) or reason not in BLOCKING_FINISH_REASONS:
            return False
    return True  # every candidate was blocked, or there is none


def _cut(model: object) -> str | None:
    """A row's ``modelVersion`` as its band names it (None: not a string)."""
    return model[:MAX_MODEL_CHARS] if isinstance(model, str) else None


def _text(data: bytes | memoryview) -> str | None:
    """``data`` decoded as UTF-8, or None when it is not UTF-8."""
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError:
        return None


def _is_utf8(data: bytes | memoryview) -> bool:
    return _text(data) is not None


def inlined_lines(responses: list[Mapping[str, Any]]) -> list[bytes]:
    """Inlined batch responses as the JSONL lines a file output would hold, in request order.

    Each item is the REST (camelCase) form of an ``InlinedResponse``: ``response`` or ``error``
    and ``metadata`` (carrying the request's ``key`` when it was given one); the line keeps the
    key at the top, as the file output does.
    """
    lines = []
    for item in responses:
        row: dict[str, Any] = {}
        metadata = item.get("metadata")
        if isinstance(metadata, Mapping) and "key" in metadata:
            row["key"] = metadata["key"]
        row.update(item)
        lines.append(json.dumps(row, separators=(",", ":"), sort_keys=True).encode("utf-8"))
    return lines
