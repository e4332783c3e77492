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


def _count(value: object) -> int:
    """A token count as JSON carries it (a number, or an int64 as decimal text); else 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value if value >= 0 else 0
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return 0


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
