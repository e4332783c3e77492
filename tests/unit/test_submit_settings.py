"""A job's settings (opstate.config.submit, issue 46): the enqueued-token caps per model, the
open-batch bound, file bytes and rows per part; a bad value names its variable."""

from __future__ import annotations

import pytest

from opstate.config import (
    DEFAULT_SUBMIT_MAX_BATCHES,
    DEFAULT_SUBMIT_MAX_FILE_BYTES,
    ConfigError,
    Settings,
    SubmitSettings,
    model_id,
)

KEY = "OPSTATE_SUBMIT_ENQUEUED_TOKENS"


def test_the_defaults_are_gemini_tier_one_table() -> None:
    # Gemini's rate-limits page, "Batch API rate limits", Tier 1 "Batch enqueued tokens":
    # "Gemini 3 Pro Preview | 50,000,000", "Gemini 2.5 Pro | 5,000,000", "Gemini 2.5 Flash |
    # 3,000,000", "Gemini 2.5 Flash-Lite | 10,000,000", "Gemini 2.0 Flash | 10,000,000",
    # "Gemini 3 Flash Preview | 3,000,000", "Gemini 3 Pro Image Preview | 2,000,000";
    # "Concurrent batch requests: 100", "Input file size limit: 2GB".
    s = SubmitSettings()
    assert s.enqueued_cap("gemini-2.5-flash") == 3_000_000
    assert s.enqueued_cap("models/gemini-2.5-pro") == 5_000_000
    assert s.enqueued_cap("gemini-2.5-flash-lite") == 10_000_000
    assert s.enqueued_cap("gemini-2.0-flash") == 10_000_000
    assert s.enqueued_cap("gemini-3-flash-preview") == 3_000_000
    assert s.enqueued_cap("gemini-3-pro-preview") == 50_000_000
    assert s.enqueued_cap("gemini-3-pro-image-preview") == 2_000_000
    assert s.enqueued_cap("some-new-model") == 2_000_000  # "*": the smallest entry
    assert s.submit_max_batches == DEFAULT_SUBMIT_MAX_BATCHES == 100
    assert DEFAULT_SUBMIT_MAX_FILE_BYTES < 2_000_000_000
    assert s.submit_max_file_bytes == DEFAULT_SUBMIT_MAX_FILE_BYTES
    assert Settings().enqueued_cap("gemini-2.5-flash") == 3_000_000


def test_given_caps_override_the_table_with_or_without_models_prefix() -> None:
    s = SubmitSettings.from_env(
        {KEY: " models/gemini-2.5-flash=5000000, gemini-2.5-pro = 7 ,*=9,", "X": "1"}
    )
    assert s.enqueued_cap("gemini-2.5-flash") == 5_000_000
    assert s.enqueued_cap("models/gemini-2.5-pro") == 7
    assert s.enqueued_cap("anything-else") == 9
    assert s.enqueued_cap("gemini-2.0-flash") == 10_000_000  # left out: the table's
    assert model_id(" Models/Gemini-2.5-Flash ") == "gemini-2.5-flash"


def test_the_other_numbers_are_read_within_bounds() -> None:
    s = SubmitSettings.from_env(
        {
            "OPSTATE_SUBMIT_MAX_BATCHES": "3",
            "OPSTATE_SUBMIT_MAX_FILE_BYTES": "4096",
            "OPSTATE_SUBMIT_MAX_ROWS": "7",
        }
    )
    assert (s.submit_max_batches, s.submit_max_file_bytes, s.submit_max_rows) == (3, 4096, 7)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (KEY, "gemini-2.5-flash", "is not MODEL=TOKENS"),
        (KEY, "gemini-2.5-flash=3M", "must be a whole number"),
        (KEY, "gemini-2.5-flash=-1", "must be a whole number"),
        (KEY, "gemini-2.5-flash=١٢", "must be a whole number"),  # Arabic-Indic digits
        (KEY, "gemini-2.5-flash=0", "more than 0"),
        (KEY, "gemini-2.5-flash=99999999999999999", "must be a whole number"),
        (KEY, "gemini-2.5-flash=1000000000000001", "at most"),
        (KEY, "a=1,models/A=2", "a is given twice"),
        (KEY, "bad model=1", "is not a model id"),
        (KEY, "=1", "is not a model id"),
        ("OPSTATE_SUBMIT_MAX_BATCHES", "0", "at least 1"),
        ("OPSTATE_SUBMIT_MAX_BATCHES", "10001", "at most"),
        ("OPSTATE_SUBMIT_MAX_FILE_BYTES", "2000000001", "at most"),
        ("OPSTATE_SUBMIT_MAX_ROWS", "x", "must be an integer"),
    ],
)
def test_a_bad_value_names_its_variable(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        Settings.from_env({key: value})
    assert key in str(info.value)
