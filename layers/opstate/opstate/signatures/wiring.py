"""The verifier a request meets: Standard Webhooks, or a JWT when dynamic webhooks are on, as
the configuration asks."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from opstate.config import ConfigError
from opstate.signatures.common import SignatureError, Verifier, lower_headers
from opstate.signatures.standard import (
    HEADER_SIGNATURE,
    SecretsProviderVerifier,
    StaticSecretsVerifier,
    log_ignored_entries,
    secrets_manager_provider,
)
from opstate.webhook_secrets import parse_stored

if TYPE_CHECKING:
    from opstate.config import Settings
    from opstate.signatures.jwt_tokens import JwtVerifier


class WebhookVerifier:
    """Standard Webhooks when the request carries ``webhook-signature``; else, when dynamic
    webhooks are configured, the JWT; else refuse.

    ``hmac_configured`` False (no secret source at all) with JWTs on is a JWT-only deployment:
    a request with only Standard Webhooks headers is refused (401), not answered "retry later"
    (no secret will ever appear to verify it)."""

    def __init__(
        self,
        standard: Verifier,
        jwt_verifier: JwtVerifier | None = None,
        *,
        hmac_configured: bool = True,
    ) -> None:
        self.standard = standard
        self.jwt = jwt_verifier
        self.hmac_configured = hmac_configured

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        lowered = lower_headers(headers)
        if self.jwt is not None and not self.hmac_configured:
            if not lowered.get(self.jwt.header):
                raise SignatureError()
            self.jwt.verify(raw_body, lowered)
            return
        if HEADER_SIGNATURE in lowered or self.jwt is None:
            self.standard.verify(raw_body, lowered)
            return
        if lowered.get(self.jwt.header):
            self.jwt.verify(raw_body, lowered)
            return
        raise SignatureError()


def verifier_from_settings(
    settings: Settings, *, clock_s: Callable[[], float] = time.time, replaying: bool = False
) -> WebhookVerifier:
    """The verifier the configuration asks for (``replaying``: for ``opstate replay`` of
    quarantined deliveries, without the timestamp tolerance and the JWT's expiry).

    Secrets Manager (``webhook_secret_arn``) wins over local ``webhook_secrets``; with neither
    (or with no usable key among them), every Standard Webhooks request answers 503. JWTs are
    accepted only with ``public_url`` set, and then ``jwt_issuers`` must be set too.
    """
    standard: Verifier
    hmac_configured = True
    if settings.webhook_secret_arn:
        standard = SecretsProviderVerifier(
            secrets_manager_provider(settings.webhook_secret_arn, settings.secrets_cache_s),
            None if replaying else settings.webhook_tolerance_s,
            clock_s=clock_s,
            where="OPSTATE_WEBHOOK_SECRET_ARN",
        )
    else:
        parsed = parse_stored(settings.webhook_secrets)
        log_ignored_entries(parsed, "OPSTATE_WEBHOOK_SECRETS")
        standard = StaticSecretsVerifier(
            parsed.keys, None if replaying else settings.webhook_tolerance_s, clock_s=clock_s
        )
        hmac_configured = bool(settings.webhook_secrets)
    return WebhookVerifier(
        standard,
        jwt_verifier_from_settings(settings, replaying=replaying),
        hmac_configured=hmac_configured,
    )


def jwt_verifier_from_settings(
    settings: Settings, *, replaying: bool = False
) -> JwtVerifier | None:
    """The JWT verifier of dynamic webhooks when ``public_url`` is set (else None); shared by
    the Lambda, ``opstate serve`` and ``opstate replay``."""
    jwt_verifier = None
    if settings.public_url:
        if not settings.jwt_issuers:
            raise ConfigError(
                "OPSTATE_JWT_ISSUER must be set when OPSTATE_PUBLIC_URL turns on JWT verification"
            )
        # Here, not at import: most deployments never turn dynamic (JWT) webhooks on.
        from opstate.signatures.jwt_tokens import JwksCache, JwtVerifier

        jwt_verifier = JwtVerifier(
            JwksCache(
                settings.jwks_url,
                timeout_s=settings.jwks_timeout_s,
                max_stale_s=settings.jwks_max_stale_s,
            ),
            audience=settings.public_url,
            issuers=settings.jwt_issuers,
            header=settings.jwt_header,
            max_lifetime_s=settings.jwt_max_lifetime_s,
            leeway_s=settings.jwt_leeway_s,
            subject=settings.jwt_subject,
            email=settings.jwt_email,
            check_expiry=not replaying,
        )
    return jwt_verifier


def pubsub_verifier_from_settings(settings: Settings) -> JwtVerifier | None:
    """The verifier of Pub/Sub push tokens (``POST /google-cloud/pubsub``): the dynamic-webhook
    JWT rules with Google's issuer, ``pubsub_audience`` and the pinned ``pubsub_email`` (a
    verified email claim); None (every push refused) unless both are set."""
    if not settings.pubsub_audience or not settings.pubsub_email:
        return None
    from opstate.config import PUBSUB_ISSUERS
    from opstate.signatures.jwt_tokens import JwksCache, JwtVerifier

    return JwtVerifier(
        JwksCache(
            settings.pubsub_jwks_url,
            timeout_s=settings.jwks_timeout_s,
            max_stale_s=settings.jwks_max_stale_s,
        ),
        audience=settings.pubsub_audience,
        issuers=PUBSUB_ISSUERS,
        header="authorization",
        max_lifetime_s=settings.jwt_max_lifetime_s,
        leeway_s=settings.jwt_leeway_s,
        email=settings.pubsub_email,
    )
