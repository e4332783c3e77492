"""All configuration, read once, in one place, from documented environment variables.

``settings()`` reads ``os.environ`` on first use and caches the result; ``Settings.from_env``
builds one from any mapping (tests). A bad value raises ``ConfigError`` naming the variable.
The README's configuration table lists every variable read here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

DEFAULT_LOCAL_STORE = "sqlite:///.opstate/ops.db"
DEFAULT_JWKS_URL = "https://generativelanguage.googleapis.com/.well-known/jwks.json"


class ConfigError(ValueError):
    """An environment variable holds a value this system cannot use."""


def _int(env: Mapping[str, str], key: str, default: int, minimum: int = 0) -> int:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return default
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
    default: float,
    minimum: float = 0.0,
    maximum: float = MAX_SECONDS,
) -> float:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return default
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


def _bounded_int(env: Mapping[str, str], key: str, default: int, maximum: int) -> int:
    value = _int(env, key, default, minimum=0)
    if value > maximum:
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


@dataclass(frozen=True, slots=True)
class Settings:
    # Store: a URL (dynamodb://TABLE or sqlite:///PATH). In Lambda, OPSTATE_TABLE_NAME is set by
    # the template and wins over the local default.
    store_url: str = DEFAULT_LOCAL_STORE
    open_index_shards: int = 4
    retention_days: int = 90
    ingest_max_attempts: int = 8
    # Webhook receiver
    webhook_secret_arn: str | None = None
    webhook_secrets: tuple[str, ...] = ()
    webhook_tolerance_s: int = 300
    max_body_bytes: int = 256 * 1024
    secrets_cache_s: int = 300
    # Signed deliveries that cannot be read are kept here (SQS queue URL; unset: logged only).
    quarantine_queue_url: str | None = None
    # Dynamic (JWT) webhooks: off unless OPSTATE_PUBLIC_URL is set.
    jwks_url: str = DEFAULT_JWKS_URL
    public_url: str | None = None
    jwt_header: str = "authorization"
    # Expected JWT issuers (OPSTATE_JWT_ISSUER, comma-separated; required with public_url), the
    # longest accepted token lifetime (exp - iat), clock leeway, optional pinned sub / email.
    jwt_issuers: tuple[str, ...] = ()
    jwt_max_lifetime_s: int = 3600
    jwt_leeway_s: int = 30
    jwt_subject: str | None = None
    jwt_email: str | None = None
    # Local server: the bearer token of the operations routes (else generated into a file).
    api_token: str | None = None
    # AWS_SAM_LOCAL=true (set by SAM CLI in sam local containers, never in a deployment): SAM
    # does not emulate the AWS_IAM authorizer, so the Lambda's IAM-context check is skipped.
    sam_local: bool = False
    # Reconciler
    gemini_api_key_secret_arn: str | None = None
    gemini_api_key: str | None = None
    reconcile_workers: int = 8
    reconcile_max_pages: int = 5
    reconcile_open_limit: int = 1000
    reconcile_safety_margin_s: float = 10.0
    reconcile_http_timeout_s: float = 5.0
    # Notifier
    event_bus_name: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        table = _str(env, "OPSTATE_TABLE_NAME")
        store_url = _str(env, "OPSTATE_STORE") or (
            f"dynamodb://{table}" if table else DEFAULT_LOCAL_STORE
        )
        secrets = tuple((env.get("OPSTATE_WEBHOOK_SECRETS") or "").split())
        return cls(
            store_url=store_url,
            open_index_shards=_int(env, "OPSTATE_OPEN_INDEX_SHARDS", 4, minimum=1),
            retention_days=_int(env, "OPSTATE_RETENTION_DAYS", 90, minimum=1),
            ingest_max_attempts=_int(env, "OPSTATE_INGEST_MAX_ATTEMPTS", 8, minimum=1),
            webhook_secret_arn=_str(env, "OPSTATE_WEBHOOK_SECRET_ARN"),
            webhook_secrets=secrets,
            webhook_tolerance_s=_int(env, "OPSTATE_WEBHOOK_TOLERANCE_SECONDS", 300, minimum=1),
            max_body_bytes=_int(env, "OPSTATE_MAX_BODY_BYTES", 256 * 1024, minimum=1),
            secrets_cache_s=_int(env, "OPSTATE_SECRETS_CACHE_SECONDS", 300, minimum=0),
            quarantine_queue_url=_str(env, "OPSTATE_QUARANTINE_QUEUE_URL"),
            jwks_url=_str(env, "OPSTATE_JWKS_URL") or DEFAULT_JWKS_URL,
            public_url=_str(env, "OPSTATE_PUBLIC_URL"),
            jwt_header=(_str(env, "OPSTATE_JWT_HEADER") or "authorization").lower(),
            jwt_issuers=_jwt_issuers(env, public_url=_str(env, "OPSTATE_PUBLIC_URL")),
            jwt_max_lifetime_s=_int(env, "OPSTATE_JWT_MAX_LIFETIME_SECONDS", 3600, minimum=1),
            jwt_leeway_s=_bounded_int(env, "OPSTATE_JWT_LEEWAY_SECONDS", 30, maximum=300),
            jwt_subject=_str(env, "OPSTATE_JWT_SUBJECT"),
            jwt_email=_str(env, "OPSTATE_JWT_EMAIL"),
            api_token=_api_token(env),
            sam_local=(env.get("AWS_SAM_LOCAL") or "").strip().lower() == "true",
            gemini_api_key_secret_arn=_str(env, "OPSTATE_GEMINI_API_KEY_SECRET_ARN"),
            gemini_api_key=_str(env, "GEMINI_API_KEY"),
            reconcile_workers=_int(env, "OPSTATE_RECONCILE_WORKERS", 8, minimum=1),
            reconcile_max_pages=_int(env, "OPSTATE_RECONCILE_MAX_PAGES", 5, minimum=0),
            reconcile_open_limit=_int(env, "OPSTATE_RECONCILE_OPEN_LIMIT", 1000, minimum=1),
            reconcile_safety_margin_s=_float(env, "OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS", 10.0),
            reconcile_http_timeout_s=_float(
                env, "OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS", 5.0, minimum=0.001
            ),
            event_bus_name=_str(env, "OPSTATE_EVENT_BUS_NAME"),
        )


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings.from_env(os.environ)
