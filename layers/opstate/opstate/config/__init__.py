"""All configuration, read once, in one place, from documented environment variables.

One frozen dataclass per part — ``StoreSettings``, ``WebhookSettings``, ``ReconcileSettings``,
``ResultsSettings``, ``NotifySettings``, ``LocalSettings``, ``WaiterSettings`` — each reading
its own variables; ``Settings`` is all of them at once. Every default is written once, as the
field's default: ``env_values`` returns only the variables that are set, so an unset one falls
back to that same default. Secret values (webhook secrets, the Gemini API key, the API token)
never appear in a ``repr``.

``settings()`` reads ``os.environ`` on first use and caches the result; ``Settings.from_env``
(or a part's ``from_env``) builds one from any mapping (tests). A bad value raises
``ConfigError`` naming the variable. The README's configuration table lists every variable read
here.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Self

from opstate.domain.names import Kind

DEFAULT_LOCAL_STORE = "sqlite:///.opstate/ops.db"
DEFAULT_JWKS_URL = "https://generativelanguage.googleapis.com/.well-known/jwks.json"
# Google's OIDC signing keys (Pub/Sub push tokens are Google-signed ID tokens).
DEFAULT_PUBSUB_JWKS_URL = "https://www.googleapis.com/oauth2/v3/certs"
# The issuers of Google-signed ID tokens.
PUBSUB_ISSUERS = ("https://accounts.google.com", "accounts.google.com")
# Defaults other modules need too (the stores' own keyword defaults, the CLI's options).
DEFAULT_OPEN_INDEX_SHARDS = 4
DEFAULT_RETENTION_DAYS = 90
DEFAULT_RECONCILE_EVERY_S = 300.0
# `opstate reconcile --once --budget`: the whole pass, Retry-After pauses included, ends by then.
DEFAULT_RECONCILE_BUDGET_S = 120.0
DEFAULT_INGEST_MAX_ATTEMPTS = 8
DEFAULT_WEBHOOK_TOLERANCE_S = 300
DEFAULT_JWT_MAX_LIFETIME_S = 3600
DEFAULT_JWT_LEEWAY_S = 30
# The local quarantine's bounds (opstate serve; in AWS the SQS queue's own limits apply).
DEFAULT_QUARANTINE_MAX_ENTRIES = 1000
DEFAULT_QUARANTINE_MAX_BYTES = 64 * 1024 * 1024
# The JWKS fetch: connect and per-read timeout (twice that in all); how long past its TTL the
# last good key set is still served while fetches fail.
DEFAULT_JWKS_TIMEOUT_S = 2.0
DEFAULT_JWKS_MAX_STALE_S = 6 * 3600.0
# How far ahead of the receiver's clock an event's time may be (reports 400, webhooks are
# quarantined, polls skipped beyond it): a time far in the future would freeze a record.
DEFAULT_MAX_FUTURE_SKEW_S = 3600.0
MAX_FUTURE_SKEW_LIMIT_S = 7 * 86400.0


class ConfigError(ValueError):
    """An environment variable holds a value this system cannot use."""


def _given(**values: Any) -> dict[str, Any]:
    """The values that were given: None means "unset, keep the field's default"."""
    return {name: value for name, value in values.items() if value is not None}


def _scaled(factor: float, value: float | None) -> float | None:
    return None if value is None else factor * value


def _int(env: Mapping[str, str], key: str, minimum: int = 0) -> int | None:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{key} must be at least {minimum}, got {value}")
    return value


# The longest a Lambda function may run: no duration setting is meaningful beyond it.
MAX_SECONDS = 900.0


def _float(
    env: Mapping[str, str],
    key: str,
    minimum: float = 0.0,
    maximum: float = MAX_SECONDS,
) -> float | None:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key} must be a number, got {raw!r}") from None
    # float() accepts "nan", "inf" and "1e999" (= inf): none is a usable duration, and NaN
    # compares false with everything, so it would pass the range checks below.
    if not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number of seconds, got {raw.strip()!r}")
    if value < minimum:
        raise ConfigError(f"{key} must be at least {minimum:g}, got {value:g}")
    if value > maximum:
        raise ConfigError(f"{key} must be at most {maximum:g}, got {value:g}")
    return value


def _str(env: Mapping[str, str], key: str) -> str | None:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return None
    return raw.strip()


def _bounded_int(env: Mapping[str, str], key: str, maximum: int, minimum: int = 0) -> int | None:
    value = _int(env, key, minimum=minimum)
    if value is not None and value > maximum:
        raise ConfigError(f"{key} must be at most {maximum}, got {value}")
    return value


def _jwt_issuers(env: Mapping[str, str], *, public_url: str | None) -> tuple[str, ...]:
    raw = env.get("OPSTATE_JWT_ISSUER") or ""
    issuers = tuple(dict.fromkeys(i.strip() for i in raw.split(",") if i.strip()))
    if public_url and not issuers:
        raise ConfigError(
            "OPSTATE_JWT_ISSUER must be set when OPSTATE_PUBLIC_URL turns on JWT verification "
            "(the iss claim a dynamic-webhook token must carry)"
        )
    return issuers


_SCOPE_SEGMENT = re.compile(r"[a-z0-9][a-z0-9._-]*", re.ASCII)


def _cloud_scopes(env: Mapping[str, str]) -> tuple[tuple[str, str], ...] | None:
    """``OPSTATE_GOOGLE_CLOUD_SCOPES``: ``PROJECT/LOCATION`` pairs, separated by spaces or
    commas, in order, without repeats."""
    key = "OPSTATE_GOOGLE_CLOUD_SCOPES"
    raw = _str(env, key)
    if raw is None:
        return None
    scopes: list[tuple[str, str]] = []
    for item in raw.replace(",", " ").split():
        project, _, location = item.partition("/")
        if not _SCOPE_SEGMENT.fullmatch(project) or not _SCOPE_SEGMENT.fullmatch(location):
            raise ConfigError(
                f"{key} must be PROJECT/LOCATION pairs separated by spaces "
                f"(e.g. 'my-project/us-central1'), got {item!r}"
            )
        if (project, location) not in scopes:
            scopes.append((project, location))
    return tuple(scopes)


MIN_API_TOKEN_LENGTH = 32


def _api_token(env: Mapping[str, str]) -> str | None:
    token = _str(env, "OPSTATE_API_TOKEN")
    if token is None:
        return None
    if len(token) < MIN_API_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise ConfigError(
            f"OPSTATE_API_TOKEN must be at least {MIN_API_TOKEN_LENGTH} characters without "
            "spaces (e.g. the output of `openssl rand -hex 32`)"
        )
    return token


DEFAULT_OVERDUE_HOURS = "batch=24"


def parse_overdue(text: str | None) -> dict[Kind, float]:
    """``"batch=24,video=2"`` (hours per kind; 0 turns a kind off) as seconds per kind.

    Raises ``ValueError`` naming the bad part.
    """
    out: dict[Kind, float] = {}
    if text is None or not text.strip():
        text = DEFAULT_OVERDUE_HOURS
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"expected kind=hours, got {part!r}")
        try:
            kind = Kind(key.strip())
        except ValueError:
            kinds = ", ".join(k.value for k in Kind)
            raise ValueError(f"unknown kind {key.strip()!r} (one of {kinds})") from None
        try:
            hours = float(value)
        except ValueError:
            raise ValueError(f"hours must be a number in {part!r}") from None
        if hours < 0:
            raise ValueError(f"hours must not be negative in {part!r}")
        out[kind] = hours * 3600.0
    return {k: v for k, v in out.items() if v > 0}


def _overdue(env: Mapping[str, str]) -> str | None:
    key = "OPSTATE_RECONCILE_OVERDUE_HOURS"
    raw = _str(env, key)
    if raw is None:
        return None
    try:
        parse_overdue(raw)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return raw


class _Part:
    """What every part of the settings provides: ``from_env`` on top of ``env_values``."""

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        """The fields whose variables are set in ``env``, checked (``ConfigError``); a field
        left out keeps its dataclass default, the one place that default is written."""
        raise NotImplementedError

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        return cls(**cls.env_values(env))


@dataclass(frozen=True, kw_only=True)
class StoreSettings(_Part):
    """The store (``store_from_url``) and ingest's conditional writes."""

    # A URL (dynamodb://TABLE or sqlite:///PATH). In Lambda, OPSTATE_TABLE_NAME is set by the
    # template and wins over the local default.
    store_url: str = DEFAULT_LOCAL_STORE
    open_index_shards: int = DEFAULT_OPEN_INDEX_SHARDS
    retention_days: int = DEFAULT_RETENTION_DAYS
    ingest_max_attempts: int = DEFAULT_INGEST_MAX_ATTEMPTS
    # Every input path (reports, webhooks, polls) refuses an event time further ahead.
    max_future_skew_s: float = DEFAULT_MAX_FUTURE_SKEW_S

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        table = _str(env, "OPSTATE_TABLE_NAME")
        return _given(
            store_url=_str(env, "OPSTATE_STORE") or (f"dynamodb://{table}" if table else None),
            open_index_shards=_int(env, "OPSTATE_OPEN_INDEX_SHARDS", minimum=1),
            retention_days=_int(env, "OPSTATE_RETENTION_DAYS", minimum=1),
            ingest_max_attempts=_int(env, "OPSTATE_INGEST_MAX_ATTEMPTS", minimum=1),
            max_future_skew_s=_float(
                env,
                "OPSTATE_MAX_FUTURE_SKEW_SECONDS",
                minimum=1.0,
                maximum=MAX_FUTURE_SKEW_LIMIT_S,
            ),
        )


@dataclass(frozen=True, kw_only=True)
class WebhookSettings(_Part):
    """The webhook receiver: secrets, limits, the quarantine, dynamic (JWT) webhooks."""

    webhook_secret_arn: str | None = None
    webhook_secrets: tuple[str, ...] = field(default=(), repr=False)
    webhook_tolerance_s: int = DEFAULT_WEBHOOK_TOLERANCE_S
    max_body_bytes: int = 256 * 1024
    # How long secret values (webhook secrets, the Gemini API key) are cached.
    secrets_cache_s: int = 300
    # Signed deliveries that cannot be read are kept here (SQS queue URL; unset: logged only).
    quarantine_queue_url: str | None = None
    # Dynamic (JWT) webhooks: off unless OPSTATE_PUBLIC_URL is set.
    jwks_url: str = DEFAULT_JWKS_URL
    jwks_timeout_s: float = DEFAULT_JWKS_TIMEOUT_S
    jwks_max_stale_s: float = DEFAULT_JWKS_MAX_STALE_S
    public_url: str | None = None
    jwt_header: str = "authorization"
    # Expected JWT issuers (OPSTATE_JWT_ISSUER, comma-separated; required with public_url), the
    # longest accepted token lifetime (exp - iat), clock leeway, optional pinned sub / email.
    jwt_issuers: tuple[str, ...] = ()
    jwt_max_lifetime_s: int = DEFAULT_JWT_MAX_LIFETIME_S
    jwt_leeway_s: int = DEFAULT_JWT_LEEWAY_S
    jwt_subject: str | None = None
    jwt_email: str | None = None
    # Pub/Sub push (POST /google-cloud/pubsub): the OIDC token's audience and the pushing
    # service account's email; the route refuses every push unless both are set.
    pubsub_audience: str | None = None
    pubsub_email: str | None = None
    pubsub_jwks_url: str = DEFAULT_PUBSUB_JWKS_URL
    # AWS_SAM_LOCAL=true (set by SAM CLI in sam local containers, never in a deployment): SAM
    # does not emulate the AWS_IAM authorizer, so the Lambda's IAM-context check is skipped.
    sam_local: bool = False

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        public_url = _str(env, "OPSTATE_PUBLIC_URL")
        header = _str(env, "OPSTATE_JWT_HEADER")
        return _given(
            webhook_secret_arn=_str(env, "OPSTATE_WEBHOOK_SECRET_ARN"),
            webhook_secrets=tuple((env.get("OPSTATE_WEBHOOK_SECRETS") or "").split()) or None,
            webhook_tolerance_s=_int(env, "OPSTATE_WEBHOOK_TOLERANCE_SECONDS", minimum=1),
            max_body_bytes=_int(env, "OPSTATE_MAX_BODY_BYTES", minimum=1),
            secrets_cache_s=_int(env, "OPSTATE_SECRETS_CACHE_SECONDS", minimum=0),
            quarantine_queue_url=_str(env, "OPSTATE_QUARANTINE_QUEUE_URL"),
            jwks_url=_str(env, "OPSTATE_JWKS_URL"),
            jwks_timeout_s=_float(env, "OPSTATE_JWKS_TIMEOUT_SECONDS", minimum=0.1, maximum=10.0),
            jwks_max_stale_s=_float(
                env, "OPSTATE_JWKS_MAX_STALE_SECONDS", minimum=0.0, maximum=7 * 86400.0
            ),
            public_url=public_url,
            jwt_header=header.lower() if header else None,
            jwt_issuers=_jwt_issuers(env, public_url=public_url) or None,
            jwt_max_lifetime_s=_int(env, "OPSTATE_JWT_MAX_LIFETIME_SECONDS", minimum=1),
            jwt_leeway_s=_bounded_int(env, "OPSTATE_JWT_LEEWAY_SECONDS", maximum=300),
            jwt_subject=_str(env, "OPSTATE_JWT_SUBJECT"),
            jwt_email=_str(env, "OPSTATE_JWT_EMAIL"),
            pubsub_audience=_str(env, "OPSTATE_PUBSUB_AUDIENCE"),
            pubsub_email=_str(env, "OPSTATE_PUBSUB_EMAIL"),
            pubsub_jwks_url=_str(env, "OPSTATE_PUBSUB_JWKS_URL"),
            sam_local=(env.get("AWS_SAM_LOCAL") or "").strip().lower() == "true" or None,
        )


@dataclass(frozen=True, kw_only=True)
class ReconcileSettings(_Part):
    """The reconciler: the Gemini API key, its pacing, schedule and marks."""

    gemini_api_key_secret_arn: str | None = None
    gemini_api_key: str | None = field(default=None, repr=False)
    reconcile_workers: int = 8
    reconcile_max_pages: int = 5
    reconcile_open_limit: int = 5000
    reconcile_safety_margin_s: float = 10.0
    reconcile_http_timeout_s: float = 5.0
    reconcile_max_rps: float = 20.0
    # Read in minutes (OPSTATE_RECONCILE_..._MINUTES), kept in seconds.
    reconcile_max_interval_s: float = 30 * 60.0
    reconcile_polled_only_max_interval_s: float = 10 * 60.0
    reconcile_lost_after_runs: int = 3
    # Read in hours (OPSTATE_RECONCILE_LOST_AFTER_HOURS), kept in seconds.
    reconcile_lost_after_s: float = 24 * 3600.0
    # "kind=hours,..." (parsed by parse_overdue)
    reconcile_overdue_hours: str = DEFAULT_OVERDUE_HOURS
    # Google Cloud (docs/google-cloud.md): discovery scopes (PROJECT, LOCATION), the rate
    # limit of Cloud requests (separate from the Gemini API's), and the credentials: a
    # Secrets Manager secret holding a google-auth JSON (external_account or service_account)
    # or, locally, google-auth's own GOOGLE_APPLICATION_CREDENTIALS file.
    google_cloud_scopes: tuple[tuple[str, str], ...] = ()
    google_cloud_max_rps: float = 10.0
    google_credentials_secret_arn: str | None = None
    google_application_credentials: str | None = None
    # Where a local credentials file's "file" source may read (unset: nowhere; security.md).
    google_subject_token_dir: str | None = None

    @property
    def google_cloud_configured(self) -> bool:
        """Whether Google Cloud is set up at all (else the reconciler never calls it)."""
        return bool(
            self.google_cloud_scopes
            or self.google_credentials_secret_arn
            or self.google_application_credentials
        )

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        return _given(
            gemini_api_key_secret_arn=_str(env, "OPSTATE_GEMINI_API_KEY_SECRET_ARN"),
            gemini_api_key=_str(env, "GEMINI_API_KEY"),
            reconcile_workers=_int(env, "OPSTATE_RECONCILE_WORKERS", minimum=1),
            reconcile_max_pages=_int(env, "OPSTATE_RECONCILE_MAX_PAGES", minimum=0),
            reconcile_open_limit=_int(env, "OPSTATE_RECONCILE_OPEN_LIMIT", minimum=1),
            reconcile_safety_margin_s=_float(env, "OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS"),
            reconcile_http_timeout_s=_float(
                env, "OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS", minimum=0.001
            ),
            reconcile_max_rps=_float(env, "OPSTATE_RECONCILE_MAX_RPS"),
            reconcile_max_interval_s=_scaled(
                60.0, _float(env, "OPSTATE_RECONCILE_MAX_INTERVAL_MINUTES", minimum=1.0)
            ),
            reconcile_polled_only_max_interval_s=_scaled(
                60.0,
                _float(env, "OPSTATE_RECONCILE_POLLED_ONLY_MAX_INTERVAL_MINUTES", minimum=1.0),
            ),
            reconcile_lost_after_runs=_int(env, "OPSTATE_RECONCILE_LOST_AFTER_RUNS", minimum=1),
            reconcile_lost_after_s=_scaled(
                3600.0, _float(env, "OPSTATE_RECONCILE_LOST_AFTER_HOURS")
            ),
            reconcile_overdue_hours=_overdue(env),
            google_cloud_scopes=_cloud_scopes(env),
            google_cloud_max_rps=_float(env, "OPSTATE_GOOGLE_CLOUD_MAX_RPS"),
            google_credentials_secret_arn=_str(env, "OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN"),
            google_application_credentials=_str(env, "GOOGLE_APPLICATION_CREDENTIALS"),
            google_subject_token_dir=_str(env, "OPSTATE_GOOGLE_SUBJECT_TOKEN_DIR"),
        )


DEFAULT_RESULTS_RETENTION_HOURS = 48.0
DEFAULT_RESULTS_WARN_HOURS = 12.0


@dataclass(frozen=True, kw_only=True)
class ResultsSettings(_Part):
    """Outcomes: where results are archived and when they are due (``opstate.outcomes``)."""

    # s3://BUCKET/PREFIX or file:///ABS/PATH; unset: .opstate/results beside a SQLite store
    # (and no archiving on DynamoDB: the template always sets it).
    results_url: str | None = None
    # How long Gemini keeps results when a file carries no expirationTime (hours; documented:
    # generated videos and Files API files, 2 days), from the terminal time.
    results_retention_s: float = DEFAULT_RESULTS_RETENTION_HOURS * 3600.0
    # An archive still not done this close to its deadline is counted (ResultsAtRisk) and
    # logged at error level (hours).
    results_warn_s: float = DEFAULT_RESULTS_WARN_HOURS * 3600.0
    # Per-read timeout of a download (seconds) and the S3 multipart part size (MiB).
    results_http_timeout_s: float = 60.0
    results_part_mib: int = 8
    # The longest batch-output line counted (MiB); a longer one is an unreadable row.
    results_max_line_mib: int = 32
    # Failed copies are retried after this (seconds, doubled per attempt up to 1 hour).
    results_retry_s: float = 60.0
    # How long a claim on one archive holds off other archivers (seconds).
    results_lease_s: float = 900.0
    # The archiver function the reconciler invokes when it finds a due archive (AWS only).
    archiver_function: str | None = None

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        url = _str(env, "OPSTATE_RESULTS_URL")
        if url is not None and not url.startswith(("s3://", "file:///")):
            raise ConfigError(
                f"OPSTATE_RESULTS_URL must be s3://BUCKET/PREFIX or file:///ABS/PATH, got {url!r}"
            )
        return _given(
            results_url=url,
            results_retention_s=_scaled(
                3600.0, _float(env, "OPSTATE_RESULTS_RETENTION_HOURS", 1.0, 24.0 * 365)
            ),
            results_warn_s=_scaled(3600.0, _float(env, "OPSTATE_RESULTS_WARN_HOURS", 0.0, 48.0)),
            results_http_timeout_s=_float(env, "OPSTATE_RESULTS_HTTP_TIMEOUT_SECONDS", 0.001),
            results_part_mib=_bounded_int(env, "OPSTATE_RESULTS_PART_MIB", 1024),
            results_max_line_mib=_bounded_int(env, "OPSTATE_RESULTS_MAX_LINE_MIB", 256, 1),
            results_retry_s=_float(env, "OPSTATE_RESULTS_RETRY_SECONDS", 1.0, 3600.0),
            results_lease_s=_float(env, "OPSTATE_RESULTS_LEASE_SECONDS", 1.0),
            archiver_function=_str(env, "OPSTATE_ARCHIVER_FUNCTION"),
        )


@dataclass(frozen=True, kw_only=True)
class NotifySettings(_Part):
    """The notifier."""

    event_bus_name: str | None = None

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        return _given(event_bus_name=_str(env, "OPSTATE_EVENT_BUS_NAME"))


DEFAULT_MAX_WAITERS = 10


def _arns(env: Mapping[str, str], key: str) -> tuple[str, ...] | None:
    """Comma-separated ARNs, or ``*``; anything else (``none``, ``off``) is refused, so that no
    value meant to turn waiters off turns them on."""
    arns = tuple(dict.fromkeys(a.strip() for a in (_str(env, key) or "").split(",") if a.strip()))
    for arn in arns:
        if arn != "*" and not arn.startswith("arn:"):
            raise ConfigError(f"{key} must be ARNs separated by commas, or '*', got {arn!r}")
    return arns or None


@dataclass(frozen=True, kw_only=True)
class WaiterSettings(_Part):
    """Waiters (docs/waiters.md): their DynamoDB table, the bound per operation, and the ARNs
    that enable each kind of waiter."""

    # The waiters table (DynamoDB stores only; SQLite keeps waiters in its own file). Unset
    # with a DynamoDB store: waiters are not enabled and a waiter is refused.
    waiters_table_name: str | None = None
    max_waiters: int = DEFAULT_MAX_WAITERS
    # The template's WaiterStateMachineArns / WaiterDurableFunctionArns ("*": any). Empty: that
    # kind of waiter is not enabled (opstate.waiters.enabled).
    waiter_state_machine_arns: tuple[str, ...] = ()
    waiter_durable_function_arns: tuple[str, ...] = ()

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        return _given(
            waiters_table_name=_str(env, "OPSTATE_WAITERS_TABLE_NAME"),
            max_waiters=_int(env, "OPSTATE_MAX_WAITERS_PER_OPERATION", minimum=1),
            waiter_state_machine_arns=_arns(env, "OPSTATE_WAITER_STATE_MACHINE_ARNS"),
            waiter_durable_function_arns=_arns(env, "OPSTATE_WAITER_DURABLE_FUNCTION_ARNS"),
        )


@dataclass(frozen=True, kw_only=True)
class LocalSettings(_Part):
    """The local server (``opstate serve``)."""

    # The bearer token of the operations routes (else generated into a file).
    api_token: str | None = field(default=None, repr=False)
    # Seconds between reconciler passes (with a Gemini API key); ``--reconcile-every`` overrides.
    reconcile_every_s: float = DEFAULT_RECONCILE_EVERY_S
    # The local quarantine keeps at most this many deliveries and bytes of bodies; when full,
    # a signed delivery it would keep is answered 503 (Gemini retries).
    quarantine_max_entries: int = DEFAULT_QUARANTINE_MAX_ENTRIES
    quarantine_max_bytes: int = DEFAULT_QUARANTINE_MAX_BYTES

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        return _given(
            api_token=_api_token(env),
            quarantine_max_entries=_int(env, "OPSTATE_QUARANTINE_MAX_ENTRIES", minimum=1),
            quarantine_max_bytes=_int(env, "OPSTATE_QUARANTINE_MAX_BYTES", minimum=1),
        )


PARTS: tuple[type[_Part], ...] = (
    StoreSettings,
    WebhookSettings,
    ReconcileSettings,
    ResultsSettings,
    NotifySettings,
    LocalSettings,
    WaiterSettings,
)


@dataclass(frozen=True, kw_only=True)
class Settings(
    WaiterSettings,
    LocalSettings,
    NotifySettings,
    ResultsSettings,
    ReconcileSettings,
    WebhookSettings,
    StoreSettings,
):
    """Every part's settings in one object (fields in the order of ``PARTS``).

    A ``Settings`` is each of its parts, so code that needs one part takes that part's type
    (``store_from_url`` takes a ``StoreSettings``) and is handed the whole. Keyword construction
    is flat: ``Settings(store_url="memory://", reconcile_workers=2)``.
    """

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for part in PARTS:
            values.update(part.env_values(env))
        return values


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings.from_env(os.environ)


def serve_store_url(env: Mapping[str, str] | None = None) -> str:
    """The store ``opstate serve`` uses without ``--store``: ``OPSTATE_STORE``, else the local
    SQLite file. ``OPSTATE_TABLE_NAME`` (the deployed table, which the other commands default
    to) is not used: a local server writes a deployed table only when told to with ``--store``
    or ``OPSTATE_STORE``."""
    return _str(os.environ if env is None else env, "OPSTATE_STORE") or DEFAULT_LOCAL_STORE
