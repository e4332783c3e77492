"""Real Gemini (and Vertex, and Google API) answers, fed through the rules (issue 39).

Each body in ``tests/fixtures/gemini_errors/`` is quoted from a public source named in its
``_source`` field (issue threads, Google's forum and error pages), one per rule; this test
feeds the error bodies through the row rules (a failed row carrying the body's ``error``) and
through the create path (the SDK's ``errors.APIError`` of that body, as google-genai raises it,
then ``classify`` and ``create_refusal``), and the refused answers through both ledger paths.
No body of a spending-cap refusal was found in public sources: its rule rests on the words
alone (docs/retry.md, "Refusals").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from opstate.domain.refusals import DAILY, MONEY, PASSING
from opstate.gemini.errors import classify
from opstate.gemini.submit import create_refusal
from opstate.outcomes.ledger import HAVE_MSGSPEC, BatchLedger
from opstate.outcomes.plan import BLOCKING_FINISH_REASONS
from opstate.retry.rules import DEFAULT_TABLE, is_transient, read_row

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gemini_errors"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"

# fixture -> (what a create refused so means, the delay Gemini asked for, a row's retry reason)
ERRORS: dict[str, tuple[str, float | None, str | None]] = {
    "per_minute_429": (PASSING, 26.0, RESOURCE_EXHAUSTED),
    "per_day_429": (DAILY, 22.0, RESOURCE_EXHAUSTED),
    "standard_sentence_help_only_429": (PASSING, None, RESOURCE_EXHAUSTED),
    "queue_full_create_429": (PASSING, None, RESOURCE_EXHAUSTED),
    "generic_hint_429": (PASSING, None, RESOURCE_EXHAUSTED),
    "vertex_429": (PASSING, None, RESOURCE_EXHAUSTED),
    "prepay_depleted_429": (MONEY, None, None),
    "prepay_depleted_402": (MONEY, None, None),
    "billing_disabled_403": (MONEY, None, None),
}
ANSWERS = {"image_prohibited_content": True}


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return loaded


def test_every_fixture_has_its_source_and_a_rule_here() -> None:
    names = {path.stem for path in FIXTURES.glob("*.json")}
    assert names == set(ERRORS) | set(ANSWERS)
    for name in names:
        body = fixture(name)
        assert body["_source"].startswith("https://"), name
        assert body["_rule"], name


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_a_failed_row_carrying_the_body_is_retried_only_when_it_passes(name: str) -> None:
    _kind, _delay, reason = ERRORS[name]
    error = fixture(name)["body"]["error"]
    row = read_row(json.dumps({"key": "k", "error": error}).encode())
    assert row is not None and not row.answered
    assert is_transient(row, DEFAULT_TABLE) == reason
    # the same row under "status" (the other google.rpc.Status field a batch output uses)
    row = read_row(json.dumps({"key": "k", "status": error}).encode())
    assert row is not None and is_transient(row, DEFAULT_TABLE) == reason


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_a_create_refused_with_the_body_means_what_the_rule_says(name: str) -> None:
    kind, delay, _reason = ERRORS[name]
    body = fixture(name)
    exc = genai_errors.APIError(body["http_status"], body["body"])
    error = classify(exc)
    assert error.status == body["http_status"]
    verdict = create_refusal(exc)
    assert (verdict.kind, verdict.delay_s) == (kind, delay)
    assert create_refusal(error) == verdict  # the same from the GatewayError


def test_the_details_kept_are_the_ones_the_rules_read() -> None:
    error = classify(genai_errors.APIError(429, fixture("per_minute_429")["body"]))
    assert error.rpc_status == RESOURCE_EXHAUSTED
    assert error.details == [
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [
                {
                    "quotaMetric": (
                        "generativelanguage.googleapis.com/generate_content_free_tier_input_token_count"
                    ),
                    "quotaId": "GenerateContentInputTokensPerModelPerMinute-FreeTier",
                    "quotaValue": "250000",
                }
            ],
        },
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "26s"},
    ]
    # the billing body's details are in a client's own encoding: none is kept
    billing = classify(genai_errors.APIError(403, fixture("billing_disabled_403")["body"]))
    assert billing.details == [] and billing.rpc_status == "PERMISSION_DENIED"


# -- refused answers: blocked, in both ledger paths ------------------------------------------


def count(lines: list[bytes], use_msgspec: bool) -> dict[str, int]:
    ledger = BatchLedger(use_msgspec=use_msgspec)
    ledger.feed(b"".join(line + b"\n" for line in lines))
    ledger.finish()
    return ledger.rows.as_dict()


WAYS = [pytest.param(False, id="stdlib")] + (
    [pytest.param(True, id="msgspec")] if HAVE_MSGSPEC else []
)


def row_of(response: dict[str, Any]) -> bytes:
    return json.dumps({"key": "k", "response": response}).encode()


@pytest.mark.parametrize("use_msgspec", WAYS)
def test_an_image_refusal_is_blocked_in_both_ledger_paths(use_msgspec: bool) -> None:
    refused = row_of(fixture("image_prohibited_content")["response"])
    assert count([refused], use_msgspec) == {
        "total": 1,
        "succeeded": 1,
        "blocked": 1,
        "failed": 0,
        "unreadable": 0,
    }
    row = read_row(refused)
    assert row is not None and row.answered and row.blocked
    assert is_transient(row, DEFAULT_TABLE) is None  # an answer: never retried


# google-genai's FinishReason (types.py): the image models' refusals, by the SDK's own words
# ("The generated image potentially violates safety policies", "... may contain prohibited
# content", "... may be a recitation from a source"). No public body of these two was found;
# the rows below carry only the SDK's name, the shape of image_prohibited_content.json.
IMAGE_REFUSALS = ("IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION")
# Empty answers whose reason names no policy: answers, succeeded only (docs/results.md).
EMPTY_ANSWERS = [
    {"candidates": [{"content": {"role": "model"}, "finishReason": "NO_IMAGE"}]},
    {"candidates": [{"content": {"role": "model"}, "finishReason": "IMAGE_OTHER"}]},
    {"candidates": [{"content": {"role": "model"}, "finishReason": "OTHER"}]},
    {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "STOP"}]},
    {"candidates": [{"content": {"role": "model"}, "finishReason": "MAX_TOKENS"}]},
]


@pytest.mark.parametrize("use_msgspec", WAYS)
def test_image_refusals_are_blocked_and_empty_answers_are_answers(use_msgspec: bool) -> None:
    sdk_names = {reason.value for reason in genai_types.FinishReason}
    assert set(IMAGE_REFUSALS) <= BLOCKING_FINISH_REASONS <= sdk_names
    refused = [
        row_of({"candidates": [{"content": {"role": "model"}, "finishReason": reason}]})
        for reason in IMAGE_REFUSALS
    ]
    assert count(refused, use_msgspec)["blocked"] == len(IMAGE_REFUSALS)
    empty = [row_of(response) for response in EMPTY_ANSWERS]
    assert count(empty, use_msgspec) == {
        "total": len(EMPTY_ANSWERS),
        "succeeded": len(EMPTY_ANSWERS),
        "blocked": 0,
        "failed": 0,
        "unreadable": 0,
    }
    for line in refused:
        row = read_row(line)
        assert row is not None and row.blocked
    for line in empty:
        row = read_row(line)
        assert row is not None and row.answered and not row.blocked
