"""The ledger's rows as msgspec structs: the only fields it counts, typed so that a line
msgspec reads into them holds exactly what ``json.loads`` of that line would show the ledger.

msgspec reads a line straight from its bytes into these structs and skips every other field
without building it (the answer text, a candidate's content), which is where the time of a
plain ``json.loads`` goes; of a candidate only its ``finishReason`` is built. Anything the
structs do not describe exactly (a field of another type, a bool or a float where a code is,
NaN, a number out of range, a lone surrogate, a value too deep) is an error here, and the
ledger then reads the line by its definition (``json.loads``). What msgspec accepts that
``json.loads`` would refuse is ruled out by the ledger itself: it hands msgspec only text that
is valid UTF-8 (msgspec does not check skipped strings), one line at a time (msgspec's
``decode_lines`` takes any whitespace between values, not only newlines). Duplicate keys: the
last one wins, as in ``json.loads``.

Imported only by ``opstate.outcomes.ledger``, which works without msgspec (slower).
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
from typing import Annotated

import msgspec

from opstate.outcomes.ledger_reading import (
    DETAIL_FIELDS,
    DETAIL_KEYS,
    MAX_COUNT,
    MODALITIES,
    USAGE_FIELDS,
)
from opstate.outcomes.plan import BLOCKING_FINISH_REASONS

# A token count as the structs take it: an int of 0..MAX_COUNT. Any other value the ledger reads
# by its definition (``ledger_reading._count``: decimal text, else an unreadable row) through
# ``line``.
type Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]


class ModalityCount(msgspec.Struct, rename="camel", gc=False):
    """One item of a ``*TokensDetails`` list (a modality that is not a string is refused, so
    ``line`` reads it: as ``OTHER``)."""

    modality: str | None = None
    token_count: Count = 0


class Usage(msgspec.Struct, rename="camel"):
    """``response.usageMetadata``: the six token counts (``ledger.USAGE_FIELDS``; a missing one
    is 0, as for the ledger; ``null`` is refused, so ``line`` counts it, as 0)."""

    prompt_token_count: Count = 0
    candidates_token_count: Count = 0
    thoughts_token_count: Count = 0
    cached_content_token_count: Count = 0
    tool_use_prompt_token_count: Count = 0
    total_token_count: Count = 0
    # The per-modality counts (``ledger_reading.DETAIL_FIELDS``; None: missing).
    prompt_tokens_details: list[ModalityCount] | None = None
    candidates_tokens_details: list[ModalityCount] | None = None
    cache_tokens_details: list[ModalityCount] | None = None
    tool_use_prompt_tokens_details: list[ModalityCount] | None = None


class PromptFeedback(msgspec.Struct, rename="camel"):
    """``response.promptFeedback``: only whether the prompt was blocked (a ``blockReason`` that
    is not a string or null is refused, so ``line`` counts it: not blocked)."""

    block_reason: str | None = None


class Candidate(msgspec.Struct, rename="camel"):
    """One of ``response.candidates``: only why it finished (its content is skipped)."""

    finish_reason: str | None = None


class Response(msgspec.Struct, rename="camel"):
    usage_metadata: Usage | None = None
    # Which model answered (its price band, ``ledger.BatchLedger.bands``); any other type is
    # refused, so ``line`` counts it: as no model named.
    model_version: str | None = None
    prompt_feedback: PromptFeedback | None = None
    # None: missing or null (the same to the ledger: no candidates)
    candidates: list[Candidate] | None = None


def is_blocked(response: Response) -> bool:
    """``ledger.is_blocked`` of a response msgspec read (a field of any other type than these
    structs take never gets here: ``line`` reads that line)."""
    feedback = response.prompt_feedback
    if feedback is not None and feedback.block_reason:
        return True
    candidates = response.candidates
    if not candidates:
        return True
    return all(candidate.finish_reason in BLOCKING_FINISH_REASONS for candidate in candidates)


class Status(msgspec.Struct):
    """A ``google.rpc.Status``: only its code is counted."""

    code: int | str | None = None


class Row(msgspec.Struct):
    """One line of a batch output: a ``response``, or a ``status`` / ``error``."""

    response: Response | None = None
    status: Status | None = None
    error: Status | None = None


decode_row = msgspec.json.Decoder(Row).decode
# (the camelCase name in ledger.USAGE_FIELDS, the getter of that count on a Usage)
USAGE_GETTERS: tuple[tuple[str, attrgetter[int]], ...] = tuple(
    (Usage.__struct_encode_fields__[i], attrgetter(name))
    for i, name in enumerate(Usage.__struct_fields__[: len(USAGE_FIELDS)])
)
_DETAIL_GETTERS = tuple(attrgetter(name) for name in Usage.__struct_fields__[len(USAGE_FIELDS) :])
assert tuple(Usage.__struct_encode_fields__[len(USAGE_FIELDS) :]) == DETAIL_FIELDS
_MODALITY_AT = {m: i for i, m in enumerate(MODALITIES)}
_OTHER_AT = MODALITIES.index("OTHER")
_WIDTH = len(MODALITIES)
_MODALITY_OF = attrgetter("modality")
_TOKENS_OF = attrgetter("token_count")


def add_details(usages: list[Usage], sums: list[int], offset: int) -> None:
    """Add the per-modality counts of ``usages`` to ``sums[offset:]`` (``DETAIL_KEYS``
    order). Each list's items over the block are gathered and read by C-level getters; a list
    of one modality only (Gemini's usual TEXT) is one sum."""
    for d, get in enumerate(_DETAIL_GETTERS):
        items = list(chain.from_iterable(filter(None, map(get, usages))))
        if not items:
            continue
        base = offset + d * _WIDTH
        modalities = list(map(_MODALITY_OF, items))
        first = modalities[0]
        if modalities.count(first) == len(modalities):
            sums[base + _MODALITY_AT.get(first, _OTHER_AT)] += sum(map(_TOKENS_OF, items))
            continue
        for modality, n in zip(modalities, map(_TOKENS_OF, items), strict=True):
            sums[base + _MODALITY_AT.get(modality, _OTHER_AT)] += n


def counts_of(usage: Usage) -> list[int]:
    """One row's counts as a band sums them (``USAGE_FIELDS`` then ``DETAIL_KEYS``)."""
    counts = [get(usage) for _key, get in USAGE_GETTERS]
    counts.extend([0] * len(DETAIL_KEYS))
    add_details([usage], counts, len(USAGE_FIELDS))
    return counts


# What decode_row raises for a line it cannot read exactly (both are msgspec.MsgspecError).
ROW_ERRORS: tuple[type[Exception], ...] = (msgspec.MsgspecError, RecursionError)
