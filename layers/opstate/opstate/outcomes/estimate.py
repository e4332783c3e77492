"""What a batch's rows may cost at most (issue 47): an upper bound read from the rows themselves,
before they are sent, at the batch price ``price`` gives an archived batch. The retry budgets
(``opstate.retry.spend``) and the job queue's parts (issue 46) call ``estimate_rows``.

Each row is one line of a batch input, ``{"key", "request": GenerateContentRequest}``:

- input tokens: at most the bytes of its line (a tokenizer gives at most one token per byte of
  UTF-8 text, and the JSON around the text only adds bytes), plus ``MEDIA_PART_TOKENS`` per
  ``inlineData`` part (a small image is billed a fixed number of tokens whatever its size:
  258, or 1,120 at high resolution, in Google's token counting guide). Inline media
  (base64) is billed far below its bytes: the bound is loose for it, never low.
- output tokens: its ``generationConfig.maxOutputTokens`` (Gemini counts thinking tokens within
  it: a thinking model that spends the budget thinking answers ``MAX_TOKENS`` with no text)
  times its ``candidateCount``; without one, the model's output limit (``OUTPUT_LIMITS``).
- a row whose bytes cannot bound what it is billed makes the estimate unknown (null, with
  why): one naming an uploaded file (``fileData``) or a context cache (``cachedContent``),
  whose tokens are not in the line, or a tool whose results Gemini adds to the prompt
  (``TOOLS_UNBOUNDED``: search, maps, URL context, code execution, file search); a model
  with no output limit known here and a row without ``maxOutputTokens``; a line that is not
  a JSON object or is longer than ``max_line_bytes``.

Priced as an archive is (``price.price_bands``): rows in price bands by their input bound, at
genai-prices' batch price or opstate's; every output token at the image rate when the model
has one (an image model's answer may be all image), else at the output rate. Pure apart from
genai-prices (imported when pricing): bytes in, dollars out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from opstate.outcomes.ledger_reading import USAGE_FIELDS, band_of
from opstate.outcomes.price import Band, UnpricedError, has_image_output, model_ref, price_bands

# Tokens added per inlineData part (above the most Google's token guide gives one image).
MEDIA_PART_TOKENS = 2_240
# The output token limit of a model, by the longest prefix of its name that matches ("Output
# token limit" on https://ai.google.dev/gemini-api/docs/models, per model page).
OUTPUT_LIMITS = {
    "gemini-2.0-flash": 8_192,
    "gemini-2.5-pro": 65_536,
    "gemini-2.5-flash": 65_536,
    "gemini-2.5-flash-image": 32_768,
    "gemini-3-pro-preview": 65_536,
    "gemini-3-flash-preview": 65_536,
    "gemini-3-pro-image-preview": 32_768,
    "gemini-3.1-flash-image-preview": 32_768,
}
# Request fields (camelCase or snake_case, as the API takes both) whose tokens a line's bytes
# do not bound.
NOT_IN_LINE = (b'"fileData"', b'"file_data"', b'"cachedContent"', b'"cached_content"')
TOOLS_UNBOUNDED = (
    b'"googleSearch"',
    b'"google_search"',
    b'"googleSearchRetrieval"',
    b'"google_search_retrieval"',
    b'"urlContext"',
    b'"url_context"',
    b'"codeExecution"',
    b'"code_execution"',
    b'"fileSearch"',
    b'"file_search"',
    b'"googleMaps"',
    b'"google_maps"',
)
MEDIA = (b'"inlineData"', b'"inline_data"')
DEFAULT_MAX_LINE_BYTES = 32 * 1024 * 1024
_PROMPT_AT = USAGE_FIELDS.index("promptTokenCount")
_OUTPUT_AT = USAGE_FIELDS.index("candidatesTokenCount")


@dataclass(frozen=True)
class RowsEstimate:
    """At most what the rows cost at the batch price: ``usd`` (None: unknown, ``reason``
    says why), the rows, and the token bounds priced."""

    usd: Decimal | None
    reason: str | None
    rows: int
    input_tokens: int
    output_tokens: int


class _Unbounded(Exception):
    pass


def output_limit(model: str) -> int | None:
    """The model's output token limit (``OUTPUT_LIMITS``, longest matching prefix), or None."""
    found = [name for name in OUTPUT_LIMITS if model.startswith(name)]
    return OUTPUT_LIMITS[max(found, key=len)] if found else None


def _lines(chunks: Iterable[bytes], max_line_bytes: int) -> Iterator[bytes]:
    held = bytearray()
    for chunk in chunks:
        held += chunk
        *done, rest = bytes(held).split(b"\n")
        held = bytearray(rest)
        if len(held) > max_line_bytes:
            raise _Unbounded(f"a line is longer than {max_line_bytes} bytes")
        yield from (line for line in done if line.strip())
    if held.strip():
        yield bytes(held)


def _positive(value: object) -> int | None:
    return value if type(value) is int and value > 0 else None


def _row_bounds(line: bytes, limit: int | None) -> tuple[int, int]:
    """(input, output) token bounds of one input line."""
    if len(line) > DEFAULT_MAX_LINE_BYTES:
        raise _Unbounded("a line is too long to read")
    for marker in (*NOT_IN_LINE, *TOOLS_UNBOUNDED):
        if marker in line:
            name = marker.decode().strip('"')
            raise _Unbounded(f"a row uses {name}, whose tokens its bytes do not bound")
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise _Unbounded("a row is not JSON") from exc
    request = row.get("request") if isinstance(row, dict) else None
    if not isinstance(request, dict):
        raise _Unbounded("a row carries no request object")
    config = request.get("generationConfig", request.get("generation_config"))
    config = config if isinstance(config, dict) else {}
    most = _positive(config.get("maxOutputTokens", config.get("max_output_tokens")))
    if most is None or (limit is not None and most > limit):
        most = limit
    if most is None:
        raise _Unbounded("a row names no maxOutputTokens and the model's output limit is unknown")
    candidates = _positive(config.get("candidateCount", config.get("candidate_count"))) or 1
    media = sum(line.count(marker) for marker in MEDIA)
    return len(line) + media * MEDIA_PART_TOKENS, most * candidates


def estimate_rows(
    chunks: Iterable[bytes],
    model: str | None,
    *,
    when: datetime | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> RowsEstimate:
    """At most what the batch input ``chunks`` (JSONL bytes, cut anywhere) costs on ``model``
    at the batch price in force at ``when`` (now when None); see the module docstring."""
    ref = model_ref(model)
    if ref is None:
        return RowsEstimate(None, "no model named", 0, 0, 0)
    limit = output_limit(ref)
    bands: dict[int, list[int]] = {}
    rows = total_in = total_out = 0
    try:
        for line in _lines(chunks, max_line_bytes):
            tokens_in, tokens_out = _row_bounds(line, limit)
            sums = bands.setdefault(band_of(tokens_in), [0, 0, 0])
            sums[0] += 1
            sums[1] += tokens_in
            sums[2] += tokens_out
            rows, total_in, total_out = rows + 1, total_in + tokens_in, total_out + tokens_out
    except _Unbounded as exc:
        return RowsEstimate(None, str(exc), rows, total_in, total_out)
    if not rows:
        return RowsEstimate(Decimal(0), None, 0, 0, 0)
    at = when or datetime.now(tz=UTC)
    try:
        image = has_image_output(ref, at)
        priced = price_bands([_band(ref, b, s, image) for b, s in bands.items()], ref, at)
    except UnpricedError as exc:
        return RowsEstimate(None, str(exc), rows, total_in, total_out)
    return RowsEstimate(priced.usd, None, rows, total_in, total_out)


def _band(ref: str, band: int, sums: list[int], image: bool) -> Band:
    counts = [0] * len(USAGE_FIELDS)
    counts[_PROMPT_AT], counts[_OUTPUT_AT] = sums[1], sums[2]
    modalities: dict[str, Any] = {}
    if image:
        modalities["candidatesTokensDetails"] = {"IMAGE": sums[2]}
    return Band(model=ref, band=band, rows=sums[0], sums=tuple(counts), modalities=modalities)
