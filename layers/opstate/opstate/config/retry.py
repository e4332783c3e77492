"""The retries' settings (issue 33; docs/retry.md): the global default policy and the bounds of
the retry runner (``opstate.retry``)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from opstate.config.local import MIN_API_TOKEN_LENGTH
from opstate.config.parse import (
    MAX_SECONDS,
    ConfigError,
    Part,
    bounded_int,
    given,
    read_bool,
    read_float,
    read_str,
    read_token,
    settings_part,
)

# The transient table's default (docs/retry.md) and the most retries of one request key: the
# bound ``opstate.domain.retry`` checks a policy against (tests/unit/test_retry_policy.py
# checks that both say the same).
DEFAULT_RETRY_TRANSIENT = "RESOURCE_EXHAUSTED,UNAVAILABLE,INTERNAL:1,DEADLINE_EXCEEDED:1"
MAX_RETRY_ATTEMPTS = 10
DEFAULT_RETRY_MAX_ROWS = 50_000
DEFAULT_RETRY_MAX_BATCHES = 10
# Gemini's batch API takes input files of up to 2 GB: far fewer rows than this fit in one.
MAX_RETRY_ROWS = 2_000_000
MAX_RETRY_BATCHES = 100
# The deployment's budget for what retries create (issue 38, ``opstate.retry.budget``): a
# lineage retrying at once per batch a team typically watches, a batch a minute.
DEFAULT_RETRY_MAX_ACTIVE_LINEAGES = 20
DEFAULT_RETRY_MAX_BATCHES_PER_HOUR = 60
MAX_RETRY_ACTIVE_LINEAGES = 10_000
MAX_RETRY_BATCHES_PER_HOUR = 100_000
# The retry token must be as strong as the API token (``config.local.MIN_API_TOKEN_LENGTH``).
MIN_RETRY_TOKEN_LENGTH = MIN_API_TOKEN_LENGTH
# An input prefix: s3://BUCKET/ or s3://BUCKET/SOME/PATH/ (a key's folders, no ".", ".." or
# empty segment); a missing last "/" is added, so "incoming" never admits "incoming-other/".
_PREFIX = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/((?:[^/\x00-\x1f\x7f]+/)*)")


def _retry_token(env: Mapping[str, str], key: str) -> str | None:
    token = read_token(env, key, MIN_RETRY_TOKEN_LENGTH)
    if token is None:
        return None
    if token == read_str(env, "OPSTATE_API_TOKEN"):
        # The point of the second token is a second right: the same value would grant it to
        # every holder of the first.
        raise ConfigError(f"{key} must differ from OPSTATE_API_TOKEN")
    return token


def _input_prefixes(env: Mapping[str, str], key: str) -> tuple[str, ...] | None:
    raw = read_str(env, key)
    if raw is None:
        return None
    prefixes: list[str] = []
    for entry in raw.split(","):
        prefix = entry.strip()
        if not prefix:
            continue
        if not prefix.endswith("/"):
            prefix += "/"
        found = _PREFIX.fullmatch(prefix)
        if found is None or any(part in (".", "..") for part in found.group(2).split("/")):
            raise ConfigError(
                f"{key}: {entry.strip()!r} is not an s3://BUCKET/ or s3://BUCKET/PATH/ prefix"
            )
        prefixes.append(prefix)
    return tuple(dict.fromkeys(prefixes))


def _transient(env: Mapping[str, str], key: str) -> str | None:
    raw = read_str(env, key)
    if raw is None:
        return None
    # Imported only when the variable is set: the webhook's init never reads it.
    from opstate.domain.retry import InvalidRetryError, parse_transient

    try:
        parse_transient(raw)
    except InvalidRetryError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return raw


# The largest spending cap taken (US dollars): far above any batch bill, and exact in the
# nano-dollars a counter keeps (``store.counters``: an int64).
MAX_COST_USD = 1_000_000_000.0


def _dollars(env: Mapping[str, str], key: str) -> float | None:
    """A spending cap in US dollars: a positive finite number (unset or empty: no cap)."""
    raw = read_str(env, key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key} must be a number of US dollars, got {raw!r}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_COST_USD:
        raise ConfigError(
            f"{key} must be more than 0 and at most {MAX_COST_USD:.0f} US dollars "
            f"(unset it for no cap), got {raw!r}"
        )
    return value


@settings_part
class RetrySettings(Part):
    """Retries of failed rows and resubmits (docs/retry.md): the default policy of an operation
    tracked with retries asked for (an explicit ``"retry"``, the CLI's flags, ``opstate
    submit``), and the bounds of the retry runner."""

    # The default policy: retries per request key (0: off) and whether an EXPIRED batch is
    # resubmitted whole. Never attached to a record on its own (webhooks, reports, polls).
    retry_max_attempts: int = 0
    retry_resubmit_expired: bool = False
    # Rows per retry batch and retry batches per original batch.
    retry_max_rows: int = DEFAULT_RETRY_MAX_ROWS
    retry_max_batches: int = DEFAULT_RETRY_MAX_BATCHES
    # Which failures are retried: names from domain.retry.TRANSIENT_REASONS, each ":N" at most.
    retry_transient: str = DEFAULT_RETRY_TRANSIENT
    # How soon an active root is looked at again, and how long a claim on a planned child holds
    # off other runners (seconds).
    retry_check_s: float = 60.0
    retry_lease_s: float = 900.0
    # The deployment's budget: lineages retrying at once, retry batches created per hour.
    retry_max_active_lineages: int = DEFAULT_RETRY_MAX_ACTIVE_LINEAGES
    retry_max_batches_per_hour: int = DEFAULT_RETRY_MAX_BATCHES_PER_HOUR
    # Who may attach a retry policy over HTTP (docs/security.md, "Acting"): in ``opstate
    # serve`` the holder of this second bearer token (never the API token's holder alone); in
    # the Lambda every IAM-authorised PUT caller once the operator set OPSTATE_RETRY_OVER_API.
    retry_api_token: str | None = field(default=None, repr=False)
    retry_over_api: bool = False
    # The s3:// prefixes a "retry.input" given over HTTP must be under (none: every one is
    # refused). On AWS the template sets the results bucket's incoming/.
    retry_input_prefixes: tuple[str, ...] = ()
    # What retries may spend (US dollars; issue 41): the default policy's cap per lineage
    # (``maxCostUSD``) and the deployment's cap per UTC day over every lineage. None: no cap.
    retry_max_cost_usd: float | None = None
    retry_daily_budget_usd: float | None = None

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        return given(
            retry_max_attempts=bounded_int(env, "OPSTATE_RETRY_MAX_ATTEMPTS", MAX_RETRY_ATTEMPTS),
            retry_resubmit_expired=read_bool(env, "OPSTATE_RETRY_RESUBMIT_EXPIRED"),
            retry_max_rows=bounded_int(env, "OPSTATE_RETRY_MAX_ROWS", MAX_RETRY_ROWS, 1),
            retry_max_batches=bounded_int(env, "OPSTATE_RETRY_MAX_BATCHES", MAX_RETRY_BATCHES, 1),
            retry_transient=_transient(env, "OPSTATE_RETRY_TRANSIENT"),
            retry_check_s=read_float(env, "OPSTATE_RETRY_CHECK_SECONDS", 1.0, 86_400.0),
            retry_lease_s=read_float(env, "OPSTATE_RETRY_LEASE_SECONDS", 1.0, MAX_SECONDS),
            retry_max_active_lineages=bounded_int(
                env, "OPSTATE_RETRY_MAX_ACTIVE_LINEAGES", MAX_RETRY_ACTIVE_LINEAGES, 1
            ),
            retry_max_batches_per_hour=bounded_int(
                env, "OPSTATE_RETRY_MAX_BATCHES_PER_HOUR", MAX_RETRY_BATCHES_PER_HOUR, 1
            ),
            retry_api_token=_retry_token(env, "OPSTATE_RETRY_API_TOKEN"),
            retry_over_api=read_bool(env, "OPSTATE_RETRY_OVER_API"),
            retry_input_prefixes=_input_prefixes(env, "OPSTATE_RETRY_INPUT_PREFIXES"),
            retry_max_cost_usd=_dollars(env, "OPSTATE_RETRY_MAX_COST_USD"),
            retry_daily_budget_usd=_dollars(env, "OPSTATE_RETRY_DAILY_BUDGET_USD"),
        )
