"""A job's settings (issue 46; docs/jobs.md): what Gemini's Batch API takes at once, per model
and per project, so that ``opstate submit`` splits an input into parts that fit and holds what
does not fit yet.

Gemini's rate-limits page ("Batch API rate limits"; "not guaranteed"): 100 concurrent batch
requests per project, an input file of at most 2 GB, and per model a cap on the tokens "that can
be enqueued for batch processing across all your active batch jobs". The caps differ by tier and
change (one project saw 5 M where the table gives 3 M): they are settings, the Tier-1 table their
default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from opstate.config.parse import ConfigError, Part, bounded_int, given, read_str, settings_part

# Gemini's rate-limits page, "Batch API rate limits", Tier 1 ("Batch enqueued tokens", text-out
# models). "*" is any other model: the smallest entry, so an unknown model is never over-fed.
TIER1_ENQUEUED_TOKENS: tuple[tuple[str, int], ...] = (
    ("gemini-3-pro-preview", 50_000_000),
    ("gemini-3-flash-preview", 3_000_000),
    ("gemini-2.5-pro", 5_000_000),
    ("gemini-2.5-flash", 3_000_000),
    ("gemini-2.5-flash-lite", 10_000_000),
    ("gemini-2.0-flash", 10_000_000),
    ("gemini-2.0-flash-lite", 10_000_000),
    ("gemini-3-pro-image-preview", 2_000_000),
    ("*", 2_000_000),
)
ANY_MODEL = "*"
# The largest cap taken: Tier 3's largest entry is 5 billion; this leaves room and stays exact
# in an int64 counter summed over many parts.
MAX_ENQUEUED_TOKENS = 10**15
# "Concurrent batch requests: 100" per project.
DEFAULT_SUBMIT_MAX_BATCHES = 100
MAX_SUBMIT_BATCHES = 10_000
# "Input file size limit: 2GB": whether G means 10^9 or 2^30 is not said, so the default stays
# 10 MB under the smaller reading, and no setting may pass it.
MAX_SUBMIT_FILE_BYTES = 2_000_000_000
DEFAULT_SUBMIT_MAX_FILE_BYTES = MAX_SUBMIT_FILE_BYTES - 10_000_000
# Rows per part: as a retry batch (``OPSTATE_RETRY_MAX_ROWS``), so a part's output and its
# retries stay small.
DEFAULT_SUBMIT_MAX_ROWS = 50_000
MAX_SUBMIT_ROWS = 2_000_000

_MODEL = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_DIGITS = re.compile(r"[0-9]{1,16}")


def model_id(model: str) -> str:
    """A model's id as the caps are keyed: without ``models/``, lowercase."""
    name = model.strip().lower()
    return name.removeprefix("models/")


def parse_enqueued_tokens(raw: str, key: str = "OPSTATE_SUBMIT_ENQUEUED_TOKENS") -> dict[str, int]:
    """``MODEL=N,...`` (``models/MODEL`` too, ``*=N`` for any other model) as a mapping of the
    entries given; ``ConfigError`` naming ``key`` for anything else (a model twice, a count that
    is not ASCII digits, 0 or above ``MAX_ENQUEUED_TOKENS``)."""
    caps: dict[str, int] = {}
    for entry in raw.split(","):
        text = entry.strip()
        if not text:
            continue
        name, sep, count = text.partition("=")
        if not sep:
            raise ConfigError(f"{key}: {text!r} is not MODEL=TOKENS")
        model = model_id(name)
        if model != ANY_MODEL and _MODEL.fullmatch(model) is None:
            raise ConfigError(f"{key}: {name.strip()!r} is not a model id (e.g. gemini-2.5-flash)")
        digits = count.strip()
        if _DIGITS.fullmatch(digits) is None:
            raise ConfigError(f"{key}: {model}'s tokens must be a whole number, got {digits!r}")
        value = int(digits)
        if not 0 < value <= MAX_ENQUEUED_TOKENS:
            raise ConfigError(
                f"{key}: {model}'s tokens must be more than 0 and at most {MAX_ENQUEUED_TOKENS}"
            )
        if model in caps:
            raise ConfigError(f"{key}: {model} is given twice")
        caps[model] = value
    return caps


def _enqueued_tokens(env: Mapping[str, str], key: str) -> tuple[tuple[str, int], ...] | None:
    raw = read_str(env, key)
    if raw is None:
        return None
    given_caps = parse_enqueued_tokens(raw, key)
    merged = dict(TIER1_ENQUEUED_TOKENS)
    merged.update(given_caps)
    return tuple(merged.items())


@settings_part
class SubmitSettings(Part):
    """How ``opstate submit`` splits one input and feeds its parts (docs/jobs.md)."""

    # Tokens that may be enqueued per model across the project's active batches: (model, cap)
    # pairs, "*" for any other model. The Tier-1 table unless OPSTATE_SUBMIT_ENQUEUED_TOKENS
    # names other numbers (entries it leaves out keep the table's).
    submit_enqueued_tokens: tuple[tuple[str, int], ...] = TIER1_ENQUEUED_TOKENS
    # Batches opstate keeps open in the project at once (every job's parts and retry batches).
    submit_max_batches: int = DEFAULT_SUBMIT_MAX_BATCHES
    # Bytes of one uploaded file, and rows of one part.
    submit_max_file_bytes: int = DEFAULT_SUBMIT_MAX_FILE_BYTES
    submit_max_rows: int = DEFAULT_SUBMIT_MAX_ROWS

    def enqueued_cap(self, model: str) -> int:
        """The configured cap of ``model`` (``models/`` or not; "*" when it is not listed)."""
        caps = dict(self.submit_enqueued_tokens)
        found = caps.get(model_id(model))
        return found if found is not None else caps.get(ANY_MODEL, TIER1_ENQUEUED_TOKENS[-1][1])

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        return given(
            submit_enqueued_tokens=_enqueued_tokens(env, "OPSTATE_SUBMIT_ENQUEUED_TOKENS"),
            submit_max_batches=bounded_int(
                env, "OPSTATE_SUBMIT_MAX_BATCHES", MAX_SUBMIT_BATCHES, 1
            ),
            submit_max_file_bytes=bounded_int(
                env, "OPSTATE_SUBMIT_MAX_FILE_BYTES", MAX_SUBMIT_FILE_BYTES, 1024
            ),
            submit_max_rows=bounded_int(env, "OPSTATE_SUBMIT_MAX_ROWS", MAX_SUBMIT_ROWS, 1),
        )
