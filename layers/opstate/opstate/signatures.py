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
JWKS (keys cached; an unknown ``kid`` refreshes the cache once). PyJWT is imported only when
this is configured.

Secrets come from ``OPSTATE_WEBHOOK_SECRETS`` (local) or Secrets Manager
(``OPSTATE_WEBHOOK_SECRET_ARN``; value a JSON list of secrets or one ``whsec_`` string), read
through Powertools Parameters with ``max_age`` so a rotation is picked up.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from standardwebhooks.webhooks import Webhook

from opstate.store.port import RetryableError

if TYPE_CHECKING:
    from opstate.config import Settings

INVALID_SIGNATURE = "invalid signature"
SECRET_PREFIX = "whsec_"
HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"

# Bounds on what an unauthenticated sender can make us process.
MAX_ID_LENGTH = 256
MAX_SIGNATURE_HEADER_LENGTH = 4096
MAX_SIGNATURE_ENTRIES = 16
_TIMESTAMP = re.compile(r"[0-9]{1,12}", re.ASCII)
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}", re.ASCII)


class SignatureError(Exception):
    """The request is not authentic. The message never says which check failed."""

    def __init__(self) -> None:
        super().__init__(INVALID_SIGNATURE)


class SecretsUnavailableError(RetryableError):
    """The secrets or keys needed to verify could not be read: answer "retry later"."""


class InvalidSecretError(ValueError):
    """A configured webhook secret is not ``whsec_<base64>`` (or bare base64)."""


class Verifier(Protocol):
    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        """Return if the request is authentic, else raise ``SignatureError``
        (or ``SecretsUnavailableError`` when the secrets cannot be read)."""
        ...


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in headers.items() if isinstance(v, str)}


def _webhook(secret: str) -> Webhook:
    """A ``standardwebhooks.Webhook`` for one secret, refusing values it would silently mangle.

    The package strips ``whsec_`` and base64-decodes the rest without validation (invalid
    characters are discarded), so a typo would yield a different key; validate first.
    """
    text = secret.strip()
    body = text.removeprefix(SECRET_PREFIX)
    if _BASE64.fullmatch(body) is None:
        raise InvalidSecretError("a webhook secret must be 'whsec_' followed by base64")
    try:
        key = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSecretError("a webhook secret must be 'whsec_' followed by base64") from None
    if not key:
        raise InvalidSecretError("a webhook secret may not be empty")
    return Webhook(key)


def _candidate_signatures(header: str) -> list[bytes]:
    """The decoded ``v1`` entries of a ``webhook-signature`` header; other entries are ignored."""
    found: list[bytes] = []
    for entry in header.split()[:MAX_SIGNATURE_ENTRIES]:
        version, sep, value = entry.partition(",")
        if version != "v1" or not sep or not value:
            continue
        try:
            found.append(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            continue
    return found


class StaticSecretsVerifier:
    """Standard Webhooks verification against a fixed set of secrets (any may match).

    ``clock_s`` returns the current Unix time in seconds; tests pass a frozen clock to verify
    the fixed sample events. ``tolerance_s`` bounds ``|now - webhook-timestamp|``.
    """

    def __init__(
        self,
        secrets: Iterable[str],
        tolerance_s: int = 300,
        *,
        clock_s: Callable[[], float] = time.time,
    ) -> None:
        self._webhooks = tuple(_webhook(s) for s in secrets)
        self._tolerance_s = tolerance_s
        self._clock_s = clock_s

    @property
    def secret_count(self) -> int:
        return len(self._webhooks)

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        lowered = _lower(headers)
        msg_id = lowered.get(HEADER_ID, "")
        timestamp = lowered.get(HEADER_TIMESTAMP, "").strip()
        signature = lowered.get(HEADER_SIGNATURE, "")
        if not self._webhooks:
            raise SignatureError()
        if not msg_id or len(msg_id) > MAX_ID_LENGTH or not signature:
            raise SignatureError()
        if len(signature) > MAX_SIGNATURE_HEADER_LENGTH:
            raise SignatureError()
        if _TIMESTAMP.fullmatch(timestamp) is None:
            raise SignatureError()
        sent_at = int(timestamp)
        if abs(self._clock_s() - sent_at) > self._tolerance_s:
            raise SignatureError()
        candidates = _candidate_signatures(signature)
        if not candidates:
            raise SignatureError()
        try:
            text = raw_body.decode("utf-8")
        except UnicodeDecodeError:
            raise SignatureError() from None
        when = datetime.fromtimestamp(sent_at, tz=UTC)
        matched = False
        for webhook in self._webhooks:
            expected = base64.b64decode(webhook.sign(msg_id, when, text).partition(",")[2])
            for candidate in candidates:
                # No early exit: every comparison runs, in constant time.
                matched |= hmac.compare_digest(expected, candidate)
        if not matched:
            raise SignatureError()


class SecretsProviderVerifier:
    """Standard Webhooks verification with secrets read from a provider on every request.

    The provider caches (Powertools Parameters ``max_age``), so a rotation in Secrets Manager is
    picked up within the cache age; the HMAC keys are rebuilt only when the secrets change.
    """

    def __init__(
        self,
        provider: Callable[[], Sequence[str]],
        tolerance_s: int = 300,
        *,
        clock_s: Callable[[], float] = time.time,
    ) -> None:
        self._provider = provider
        self._tolerance_s = tolerance_s
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._secrets: tuple[str, ...] | None = None
        self._verifier = StaticSecretsVerifier((), tolerance_s, clock_s=clock_s)

    def _current(self) -> StaticSecretsVerifier:
        secrets = tuple(self._provider())
        with self._lock:
            if secrets != self._secrets:
                try:
                    verifier = StaticSecretsVerifier(
                        secrets, self._tolerance_s, clock_s=self._clock_s
                    )
                except InvalidSecretError as exc:
                    raise SecretsUnavailableError(
                        f"the webhook secret is unusable: {exc}"
                    ) from None
                self._verifier, self._secrets = verifier, secrets
            return self._verifier

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        self._current().verify(raw_body, headers)


def parse_secret_value(value: object) -> tuple[str, ...]:
    """A Secrets Manager value: a JSON list of secrets, or one (or space-separated) secret(s)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise SecretsUnavailableError("the webhook secret value is not text")
    text = value.strip()
    if text.startswith("{"):
        raise SecretsUnavailableError(
            "the webhook secret value must be a JSON list or a whsec_ string, not a JSON object"
        )
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            raise SecretsUnavailableError("the webhook secret value is not a JSON list") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise SecretsUnavailableError("the webhook secret JSON must be a list of strings")
        secrets = tuple(i.strip() for i in items if i.strip())
    else:
        secrets = tuple(text.split())
    if not secrets:
        raise SecretsUnavailableError("the webhook secret value holds no secret")
    return secrets


def secrets_manager_provider(secret_id: str, max_age_s: int) -> Callable[[], tuple[str, ...]]:
    """A provider reading ``secret_id`` through Powertools Parameters (cached ``max_age_s``)."""

    def provide() -> tuple[str, ...]:
        from aws_lambda_powertools.utilities.parameters import get_secret
        from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

        try:
            value = get_secret(secret_id, max_age=max_age_s)
        except GetParameterError as exc:
            raise SecretsUnavailableError(f"could not read the webhook secret: {exc}") from None
        return parse_secret_value(value)

    return provide


# --- Dynamic webhooks: RS256 JWT against a JWKS -------------------------------------------------


class JwksCache:
    """Public keys by ``kid`` from a JWKS URL, cached ``ttl_s``; an unknown ``kid`` refreshes once.

    An unknown ``kid`` triggers at most one refresh per ``min_refresh_s``, so a sender cycling
    random ``kid`` values cannot make every request fetch the JWKS.
    """

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float = 3600.0,
        min_refresh_s: float = 30.0,
        timeout_s: float = 5.0,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self._ttl_s = ttl_s
        self._min_refresh_s = min_refresh_s
        self._timeout_s = timeout_s
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._keys: dict[str, Any] = {}
        self._fetched_at: float | None = None
        self.fetches = 0

    def _fetch(self) -> None:
        import urllib.request

        import jwt

        try:
            with urllib.request.urlopen(self.url, timeout=self._timeout_s) as response:
                document = json.loads(response.read())
            keyset = jwt.PyJWKSet.from_dict(document)
        except Exception as exc:  # network, JSON or key-format failure: retry later
            raise SecretsUnavailableError(f"could not read the JWKS: {exc}") from None
        self.fetches += 1
        self._keys = {k.key_id: k for k in keyset.keys if k.key_id}
        self._fetched_at = self._clock_s()

    def key(self, kid: str) -> Any:
        """The PyJWK for ``kid``, or None when it is unknown even after a refresh."""
        with self._lock:
            now = self._clock_s()
            if self._fetched_at is None or now - self._fetched_at > self._ttl_s:
                self._fetch()
            found = self._keys.get(kid)
            if found is not None:
                return found
            assert self._fetched_at is not None
            if now - self._fetched_at >= self._min_refresh_s:
                self._fetch()
                return self._keys.get(kid)
            return None


class JwtVerifier:
    """RS256 JWT in ``header`` (``Bearer <jwt>`` or the bare token), audience ``audience``."""

    def __init__(self, jwks: JwksCache, *, audience: str, header: str = "authorization") -> None:
        self._jwks = jwks
        self._audience = audience
        self.header = header.lower()

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        import jwt

        token = _lower(headers).get(self.header, "").strip()
        if token[:7].lower() == "bearer ":
            token = token[7:].strip()
        if not token or len(token) > 16384:
            raise SignatureError()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise SignatureError() from None
        kid = header.get("kid")
        if header.get("alg") != "RS256" or not isinstance(kid, str) or not kid:
            raise SignatureError()
        key = self._jwks.key(kid)
        if key is None:
            raise SignatureError()
        try:
            jwt.decode(
                token,
                key.key,
                algorithms=["RS256"],
                audience=self._audience,
                options={"require": ["exp", "aud"]},
                leeway=5,
            )
        except jwt.PyJWTError:
            raise SignatureError() from None


class WebhookVerifier:
    """Standard Webhooks when the request carries ``webhook-signature``; else, when dynamic
    webhooks are configured, the JWT; else refuse."""

    def __init__(self, standard: Verifier, jwt_verifier: JwtVerifier | None = None) -> None:
        self.standard = standard
        self.jwt = jwt_verifier

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        lowered = _lower(headers)
        if HEADER_SIGNATURE in lowered or self.jwt is None:
            self.standard.verify(raw_body, lowered)
            return
        if lowered.get(self.jwt.header):
            self.jwt.verify(raw_body, lowered)
            return
        raise SignatureError()


def verifier_from_settings(
    settings: Settings, *, clock_s: Callable[[], float] = time.time
) -> WebhookVerifier:
    """The verifier the configuration asks for.

    Secrets Manager (``webhook_secret_arn``) wins over local ``webhook_secrets``; with neither,
    every Standard Webhooks request is refused. JWTs are accepted only with ``public_url`` set.
    """
    standard: Verifier
    if settings.webhook_secret_arn:
        standard = SecretsProviderVerifier(
            secrets_manager_provider(settings.webhook_secret_arn, settings.secrets_cache_s),
            settings.webhook_tolerance_s,
            clock_s=clock_s,
        )
    else:
        standard = StaticSecretsVerifier(
            settings.webhook_secrets, settings.webhook_tolerance_s, clock_s=clock_s
        )
    jwt_verifier = None
    if settings.public_url:
        jwt_verifier = JwtVerifier(
            JwksCache(settings.jwks_url), audience=settings.public_url, header=settings.jwt_header
        )
    return WebhookVerifier(standard, jwt_verifier)
