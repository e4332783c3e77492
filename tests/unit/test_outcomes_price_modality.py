"""What a batch cost by modality and cache (issue 47): image output at the image rate, audio at
the audio rate, cache reads at Google's batch cache rate, and null with why where genai-prices
has no rate of the modality: never a lower figure. Each test failed on 0.6.0 (which priced
every token as text and halved the cache rate too)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from opstate.outcomes.ledger import BatchLedger
from opstate.outcomes.price import bands_of, cost_of

WHEN_NS = int(datetime(2026, 12, 1, tzinfo=UTC).timestamp()) * 10**9
# Before genai-prices' batch variants start (2026-10-14): opstate's own batch price applies.
BEFORE_VARIANTS_NS = int(datetime(2026, 9, 1, tzinfo=UTC).timestamp()) * 10**9

# Real usageMetadata shapes (the per-modality lists Gemini writes):
# - gemini-3-pro-image-preview, from BerriAI/litellm issue #18182 (2025-12-18, the response's
#   usageMetadata as logged: promptTokenCount 533, candidatesTokenCount 1120,
#   totalTokenCount 1870, a TEXT prompt part of 6, 1,120 IMAGE output tokens; the prompt's
#   IMAGE part and the thoughts are what the totals leave: 527 and 217).
IMAGE_EDIT = {
    "promptTokenCount": 533,
    "candidatesTokenCount": 1120,
    "totalTokenCount": 1870,
    "thoughtsTokenCount": 217,
    "trafficType": "ON_DEMAND",
    "promptTokensDetails": [
        {"modality": "TEXT", "tokenCount": 6},
        {"modality": "IMAGE", "tokenCount": 527},
    ],
    "candidatesTokensDetails": [{"modality": "IMAGE", "tokenCount": 1120}],
}
# - gemini-2.5-flash with audio input, from a public incident ticket ("Ticket 11: Gemini
#   Summary Repetition", the response's usageMetadata quoted whole, modelVersion
#   gemini-2.5-flash, finishReason MAX_TOKENS).
AUDIO_IN = {
    "promptTokenCount": 19655,
    "candidatesTokenCount": 5871,
    "promptTokensDetails": [
        {"modality": "TEXT", "tokenCount": 452},
        {"modality": "AUDIO", "tokenCount": 19203},
    ],
    "thoughtsTokenCount": 6115,
}
# - a TTS answer (audio output): candidatesTokensDetails [{"modality": "AUDIO", ...}], the
#   shape google-genai's UsageMetadata documents and a public TTS client quotes from a live
#   gemini-2.5-flash-preview-tts call (8 TEXT prompt tokens, 51 AUDIO output tokens).
AUDIO_OUT = {
    "promptTokenCount": 8,
    "candidatesTokenCount": 51,
    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 8}],
    "candidatesTokensDetails": [{"modality": "AUDIO", "tokenCount": 51}],
}


def line(model: str, usage: dict[str, Any]) -> bytes:
    response = {
        "candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "STOP"}],
        "modelVersion": model,
        "usageMetadata": usage,
    }
    return json.dumps({"key": "k", "response": response}).encode() + b"\n"


def priced(data: bytes, use_msgspec: bool = True, when_ns: int = WHEN_NS) -> dict[str, Any]:
    ledger = BatchLedger(use_msgspec=use_msgspec)
    ledger.feed(data)
    ledger.finish()
    summary = {"rows": ledger.rows.as_dict(), "usageBands": bands_of(ledger.bands)}
    return cost_of(summary, None, when_ns, when_ns)


ISSUE_IMAGE_ROW = {
    "promptTokenCount": 20,
    "candidatesTokenCount": 1120,
    "totalTokenCount": 1140,
    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 20}],
    "candidatesTokensDetails": [{"modality": "IMAGE", "tokenCount": 1120}],
}


@pytest.mark.parametrize("use_msgspec", [True, False], ids=["msgspec", "stdlib"])
@pytest.mark.parametrize("when_ns", [WHEN_NS, BEFORE_VARIANTS_NS], ids=["variant", "opstate"])
def test_eight_image_rows_cost_the_image_price(use_msgspec: bool, when_ns: int) -> None:
    """The issue's batch: 8 rows of gemini-3-pro-image-preview, 20 text prompt tokens and
    1,120 IMAGE output tokens each. Google's batch price: $0.067 per 1K/2K image ($60 / 1M
    image output tokens, https://ai.google.dev/gemini-api/docs/pricing, "Gemini 3 Pro Image
    Preview", Batch), $1 / 1M input: 8 x (20 x 1e-6 + 1120 x 60e-6) = $0.53776. 0.6.0 showed
    $0.054 (the image tokens at the $6 text output rate)."""
    cost = priced(line("gemini-3-pro-image-preview", ISSUE_IMAGE_ROW) * 8, use_msgspec, when_ns)
    assert Decimal(cost["usd"]) == Decimal("0.53776")
    assert round(Decimal(cost["usd"]), 3) == Decimal("0.538")


def test_a_flash_image_row_costs_twenty_times_a_text_row() -> None:
    """gemini-3.1-flash-image-preview: $30 / 1M image output tokens in a batch, $1.5 text."""
    cost = priced(line("gemini-3.1-flash-image-preview", ISSUE_IMAGE_ROW))
    assert Decimal(cost["usd"]) == Decimal("0.25") * 20 / 10**6 + Decimal(30) * 1120 / 10**6


def test_cached_tokens_keep_the_standard_cache_rate_in_a_batch() -> None:
    """The issue's row on gemini-2.0-flash (no batch price in genai-prices): 1,000 prompt
    tokens (800 cached) + 700 output. Google's batch table: input $0.05 / 1M, output
    $0.20 / 1M, context caching $0.025 / 1M (the standard rate): 200 x 0.05 + 800 x 0.025 +
    700 x 0.2 = $0.000170 (0.6.0: $0.000160, the cache halved too)."""
    usage = {"promptTokenCount": 1000, "cachedContentTokenCount": 800, "candidatesTokenCount": 700}
    cost = priced(line("gemini-2.0-flash", usage))
    assert Decimal(cost["usd"]) == Decimal("0.000170")
    assert cost["batch_discount"]["by"] == "opstate"


def test_the_real_image_edit_row_is_priced_at_the_image_rate() -> None:
    cost = priced(line("gemini-3-pro-image-preview", IMAGE_EDIT))
    # batch: input $1 / 1M (text and image alike), thoughts $6 / 1M, image output $60 / 1M
    expected = (Decimal(533) * 1 + Decimal(217) * 6 + Decimal(1120) * 60) / 10**6
    assert Decimal(cost["usd"]) == expected


def test_the_real_audio_input_row_is_priced_at_the_audio_rate() -> None:
    """gemini-2.5-flash batch: text input $0.15 / 1M, audio input $0.50 / 1M, output $1.25."""
    cost = priced(line("gemini-2.5-flash", AUDIO_IN))
    expected = (
        Decimal(452) * Decimal("0.15")
        + Decimal(19203) * Decimal("0.5")
        + Decimal(5871 + 6115) * Decimal("1.25")
    ) / 10**6
    assert Decimal(cost["usd"]) == expected


@pytest.mark.parametrize(
    ("model", "usage", "words"),
    [
        # genai-prices 0.2.5 has no audio output rate for its TTS models: not the text rate
        ("gemini-2.5-flash-tts", AUDIO_OUT, "output audio"),
        # nor an audio input rate for the image model
        (
            "gemini-3-pro-image-preview",
            {**AUDIO_IN, "candidatesTokenCount": 10, "thoughtsTokenCount": 0},
            "input audio",
        ),
        # a modality of no known name
        (
            "gemini-2.5-flash",
            {"candidatesTokenCount": 5, "candidatesTokensDetails": [{"tokenCount": 5}]},
            "modality",
        ),
    ],
)
def test_a_modality_without_its_own_rate_is_unknown_not_lower(
    model: str, usage: dict[str, Any], words: str
) -> None:
    cost = priced(line(model, usage))
    assert cost["usd"] is None
    assert words in cost["reason"]


def test_a_summary_of_0_6_0_without_modalities_is_still_priced() -> None:
    """Archives written by 0.6.0 keep their ``usageBands`` without ``modalities``: priced as
    before (every token as text), read without error."""
    summary = {
        "rows": {"total": 1, "succeeded": 1, "blocked": 0, "failed": 0, "unreadable": 0},
        "usageBands": [
            {
                "model": "gemini-2.5-flash",
                "band": 0,
                "rows": 1,
                "usage": {"promptTokenCount": 1000, "candidatesTokenCount": 100},
            }
        ],
    }
    cost = cost_of(summary, None, WHEN_NS, WHEN_NS)
    assert Decimal(cost["usd"]) == (Decimal(1000) * Decimal("0.15") + 100 * Decimal("1.25")) / 10**6
