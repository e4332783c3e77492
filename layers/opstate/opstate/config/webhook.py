"""The webhook receiver's settings: secrets, limits, the quarantine, dynamic (JWT) webhooks and
Pub/Sub push."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from opstate.config.google_cloud import DEFAULT_PUBSUB_JWKS_URL
from opstate.config.parse import (
    ConfigError,
    Part,
    bounded_int,
    given,
    read_float,
    read_int,
    read_str,
    settings_part,
)

DEFAULT_JWKS_URL = "https://generativelanguage.googleapis.com/.well-known/jwks.json"
DEFAULT_WEBHOOK_TOLERANCE_S = 300
DEFAULT_JWT_MAX_LIFETIME_S = 3600
DEFAULT_JWT_LEEWAY_S = 30
# The JWKS fetch: connect and per-read timeout (twice that in all); how long past its TTL the
# last good key set is still served while fetches fail.
DEFAULT_JWKS_TIMEOUT_S = 2.0
DEFAULT_JWKS_MAX_STALE_S = 6 * 3600.0


def _jwt_issuers(env: Mapping[str, str], *, public_url: str | None) -> tuple[str, ...]:
    raw = env.get("OPSTATE_JWT_ISSUER") or ""
    issuers = tuple(dict.fromkeys(i.strip() for i in raw.split(",") if i.strip()))
    if public_url and not issuers:
        raise ConfigError(
            "OPSTATE_JWT_ISSUER must be set when OPSTATE_PUBLIC_URL turns on JWT verification "
            "(the iss claim a dynamic-webhook token must carry)"
        )
    return issuers


@settings_part
class WebhookSettings(Part):
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
        public_url = read_str(env, "OPSTATE_PUBLIC_URL")
        header = read_str(env, "OPSTATE_JWT_HEADER")
        return given(
            webhook_secret_arn=read_str(env, "OPSTATE_WEBHOOK_SECRET_ARN"),
            webhook_secrets=tuple((env.get("OPSTATE_WEBHOOK_SECRETS") or "").split()) or None,
            webhook_tolerance_s=read_int(env, "OPSTATE_WEBHOOK_TOLERANCE_SECONDS", minimum=1),
            max_body_bytes=read_int(env, "OPSTATE_MAX_BODY_BYTES", minimum=1),
            secrets_cache_s=read_int(env, "OPSTATE_SECRETS_CACHE_SECONDS", minimum=0),
            quarantine_queue_url=read_str(env, "OPSTATE_QUARANTINE_QUEUE_URL"),
            jwks_url=read_str(env, "OPSTATE_JWKS_URL"),
            jwks_timeout_s=read_float(
                env, "OPSTATE_JWKS_TIMEOUT_SECONDS", minimum=0.1, maximum=10.0
            ),
            jwks_max_stale_s=read_float(
                env, "OPSTATE_JWKS_MAX_STALE_SECONDS", minimum=0.0, maximum=7 * 86400.0
            ),
            public_url=public_url,
            jwt_header=header.lower() if header else None,
            jwt_issuers=_jwt_issuers(env, public_url=public_url) or None,
            jwt_max_lifetime_s=read_int(env, "OPSTATE_JWT_MAX_LIFETIME_SECONDS", minimum=1),
            jwt_leeway_s=bounded_int(env, "OPSTATE_JWT_LEEWAY_SECONDS", maximum=300),
            jwt_subject=read_str(env, "OPSTATE_JWT_SUBJECT"),
            jwt_email=read_str(env, "OPSTATE_JWT_EMAIL"),
            pubsub_audience=read_str(env, "OPSTATE_PUBSUB_AUDIENCE"),
            pubsub_email=read_str(env, "OPSTATE_PUBSUB_EMAIL"),
            pubsub_jwks_url=read_str(env, "OPSTATE_PUBSUB_JWKS_URL"),
            sam_local=(env.get("AWS_SAM_LOCAL") or "").strip().lower() == "true" or None,
        )
