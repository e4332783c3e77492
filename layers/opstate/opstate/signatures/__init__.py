"""Webhook authenticity: Standard Webhooks HMAC signatures and, optionally, RS256 JWTs.

Static (project-level) Gemini webhooks follow Standard Webhooks: headers ``webhook-id``,
``webhook-timestamp`` (Unix seconds of this attempt) and ``webhook-signature`` (space-separated
``v1,<base64 HMAC-SHA256>`` entries over ``"{id}.{timestamp}.{raw body}"``). Several secrets may
be valid at once (rotation): any ``v1`` entry matching any secret passes.

The ``standardwebhooks`` package decodes the ``whsec_`` secrets and computes the HMAC
(``Webhook.sign``). Its own ``verify`` is not used: it fixes the tolerance at five minutes
against the wall clock (no injectable clock), parses the timestamp as a float (so ``1e9`` or
``1700000000.5`` would pass parsing), and raises non-verification errors (``ValueError``,
``binascii.Error``) for malformed signature entries. Here the timestamp must be an integer,
the tolerance and clock are parameters, malformed entries are skipped, and every refusal is
one ``SignatureError`` whose message never says which check failed.

Dynamic webhooks (off unless ``OPSTATE_PUBLIC_URL`` is set) carry an RS256 JWT checked against a
JWKS (keys cached; an unknown ``kid`` refreshes the cache once): signature, ``aud`` (the public
URL), ``iss`` (``OPSTATE_JWT_ISSUER``, required), ``iat`` and ``exp`` (both required; lifetime
at most ``OPSTATE_JWT_MAX_LIFETIME_SECONDS``), and optionally a pinned ``sub`` / ``email``.
The body is not bound to the token (docs/api.md says what that allows). PyJWT is imported only
when this is configured.

Secrets come from ``OPSTATE_WEBHOOK_SECRETS`` (local), a local file (``opstate serve``) or
Secrets Manager (``OPSTATE_WEBHOOK_SECRET_ARN``, read through Powertools Parameters with
``max_age`` so a rotation is picked up). Every stored value is parsed by
``opstate.webhook_secrets`` (one rule: only ``whsec_`` keys of at least 24 bytes count; other
entries are ignored with a warning naming their position). With no usable key the verifier
raises ``SecretsUnavailableError``: the webhook answers 503 and the secrets alarm fires.

The package owns webhook authenticity: ``common`` (the ``Verifier`` port, its errors),
``standard`` (Standard Webhooks), ``jwt_tokens`` (RS256 JWTs against a JWKS) and ``wiring``
(``WebhookVerifier`` and ``verifier_from_settings``); every name callers use is re-exported
here. It may import the domain and settings (``opstate.config``), ``opstate.store.port`` (for
``RetryableError``), ``opstate.webhook_secrets`` and ``opstate.observability``, never the API
or anything above it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from opstate.config import DEFAULT_JWT_LEEWAY_S, DEFAULT_JWT_MAX_LIFETIME_S
from opstate.signatures.common import (
    INVALID_SIGNATURE,
    InvalidSecretError,
    SecretsUnavailableError,
    SignatureError,
    Verifier,
)
from opstate.signatures.standard import (
    HEADER_ID,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    MAX_ID_LENGTH,
    MAX_SIGNATURE_ENTRIES,
    MAX_SIGNATURE_HEADER_LENGTH,
    SecretsProviderVerifier,
    StaticSecretsVerifier,
    log_ignored_entries,
    secrets_manager_provider,
)
from opstate.signatures.wiring import (
    WebhookVerifier,
    jwt_verifier_from_settings,
    pubsub_verifier_from_settings,
    verifier_from_settings,
)

if TYPE_CHECKING:
    from opstate.signatures.jwt_tokens import MAX_JWT_LENGTH, JwksCache, JwtVerifier

# Loaded on first use: JWT verification (PyJWT) is off unless OPSTATE_PUBLIC_URL is set.
_LAZY = frozenset(
    {
        "DEFAULT_JWT_LEEWAY_S",
        "DEFAULT_JWT_MAX_LIFETIME_S",
        "MAX_JWT_LENGTH",
        "JwksCache",
        "JwtVerifier",
    }
)

__all__ = [
    "DEFAULT_JWT_LEEWAY_S",
    "DEFAULT_JWT_MAX_LIFETIME_S",
    "HEADER_ID",
    "HEADER_SIGNATURE",
    "HEADER_TIMESTAMP",
    "INVALID_SIGNATURE",
    "MAX_ID_LENGTH",
    "MAX_JWT_LENGTH",
    "MAX_SIGNATURE_ENTRIES",
    "MAX_SIGNATURE_HEADER_LENGTH",
    "InvalidSecretError",
    "JwksCache",
    "JwtVerifier",
    "SecretsProviderVerifier",
    "SecretsUnavailableError",
    "SignatureError",
    "StaticSecretsVerifier",
    "Verifier",
    "WebhookVerifier",
    "jwt_verifier_from_settings",
    "log_ignored_entries",
    "pubsub_verifier_from_settings",
    "secrets_manager_provider",
    "verifier_from_settings",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'opstate.signatures' has no attribute {name!r}")
    value = getattr(importlib.import_module("opstate.signatures.jwt_tokens"), name)
    globals()[name] = value
    return value
