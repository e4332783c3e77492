"""The bound of a batch's rows (issue 47, ``outcomes.estimate.estimate_rows``): bytes in, at
most their batch price out, or null with why; never below what the rows can be billed."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from opstate.outcomes.estimate import MEDIA_PART_TOKENS, estimate_rows, output_limit

WHEN = datetime(2026, 12, 1, tzinfo=UTC)


def rows(*requests: dict[str, Any]) -> bytes:
    return b"".join(
        json.dumps({"key": f"k{i}", "request": r}).encode() + b"\n" for i, r in enumerate(requests)
    )


def text(words: str, **config: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"contents": [{"parts": [{"text": words}]}]}
    if config:
        request["generationConfig"] = config
    return request


def test_input_is_bounded_by_the_line_bytes_and_output_by_max_output_tokens() -> None:
    data = rows(text("hello", maxOutputTokens=100), text("w " * 1000, maxOutputTokens=50))
    found = estimate_rows([data[:7], data[7:]], "models/gemini-2.5-flash", when=WHEN)
    assert (found.rows, found.input_tokens, found.output_tokens) == (2, len(data) - 2, 150)
    # gemini-2.5-flash in a batch: $0.15 / 1M input, $1.25 / 1M output (genai-prices 0.2.5)
    assert found.usd == (Decimal(len(data) - 2) * Decimal("0.15") + 150 * Decimal("1.25")) / 10**6


def test_without_max_output_tokens_the_model_limit_is_the_allowance() -> None:
    found = estimate_rows([rows(text("hi"))], "gemini-2.0-flash", when=WHEN)
    assert found.output_tokens == 8_192 == output_limit("gemini-2.0-flash-001")
    found = estimate_rows([rows(text("hi", candidateCount=2))], "gemini-2.5-pro", when=WHEN)
    assert found.output_tokens == 2 * 65_536


def test_an_image_model_bounds_output_at_the_image_rate() -> None:
    found = estimate_rows(
        [rows(text("a cat", maxOutputTokens=1120))], "gemini-3-pro-image-preview", when=WHEN
    )
    assert found.usd is not None and found.usd >= Decimal(1120) * 60 / 10**6


def test_inline_media_adds_its_floor() -> None:
    part = {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}
    request = {"contents": [{"parts": [part]}], "generationConfig": {"maxOutputTokens": 1}}
    data = rows(request)
    found = estimate_rows([data], "gemini-2.5-flash", when=WHEN)
    assert found.input_tokens == len(data) - 1 + MEDIA_PART_TOKENS


@pytest.mark.parametrize(
    ("request_", "model", "words"),
    [
        (
            {"contents": [{"parts": [{"fileData": {"fileUri": "files/x"}}]}]},
            "gemini-2.5-flash",
            "fileData",
        ),
        ({**text("q"), "cachedContent": "cachedContents/c"}, "gemini-2.5-flash", "cachedContent"),
        ({**text("q"), "tools": [{"googleSearch": {}}]}, "gemini-2.5-flash", "googleSearch"),
        (text("q"), "gemini-9-unknown", "output limit"),
        (text("q", maxOutputTokens=5), "gemini-9-unknown", "does not know"),
    ],
)
def test_what_the_bytes_cannot_bound_is_unknown_with_why(
    request_: dict[str, Any], model: str, words: str
) -> None:
    found = estimate_rows([rows(text("fine", maxOutputTokens=1), request_)], model, when=WHEN)
    assert found.usd is None and words in str(found.reason)


def test_no_rows_cost_nothing_and_no_model_is_unknown() -> None:
    assert estimate_rows([], "gemini-2.5-flash").usd == 0
    assert estimate_rows([rows(text("q"))], None).usd is None
    assert estimate_rows([b"not json\n"], "gemini-2.5-flash").usd is None
