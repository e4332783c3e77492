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
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from standardwebhooks.webhooks import Webhook

from opstate.config import ConfigError
from opstate.store.port import RetryableError
from opstate.webhook_secrets import KEY_RULE, ParsedSecrets, parse_stored, secret_key

if TYPE_CHECKING:
    from opstate.config import Settings

INVALID_SIGNATURE = "invalid signature"
HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"

# Bounds on what an unauthenticated sender can make us process.
MAX_ID_LENGTH = 256
MAX_SIGNATURE_HEADER_LENGTH = 4096
MAX_SIGNATURE_ENTRIES = 16
_TIMESTAMP = re.compile(r"[0-9]{1,12}", re.ASCII)


class SignatureError(Exception):
    """The request is not authentic. The message never says which check failed."""

    def __init__(self) -> None:
        super().__init__(INVALID_SIGNATURE)


class SecretsUnavailableError(RetryableError):
    """The secrets or keys needed to verify could not be read: answer "retry later"."""


class InvalidSecretError(ValueError):
    """A webhook secret handed to a verifier is not a key (``whsec_`` + base64, >= 24 bytes)."""


class Verifier(Protocol):
    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        """Return if the request is authentic, else raise ``SignatureError``
        (or ``SecretsUnavailableError`` when the secrets cannot be read)."""
        ...


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in headers.items() if isinstance(v, str)}


def _webhook(secret: str) -> Webhook:
    """A ``standardwebhooks.Webhook`` for one key (``opstate.webhook_secrets``' rule)."""
    key = secret_key(secret.strip())
    if key is None:
        raise InvalidSecretError(f"a webhook secret must be {KEY_RULE}")
    return Webhook(key)


def log_ignored_entries(parsed: ParsedSecrets, where: str) -> None:
    """One warning per stored entry that is not a key: its position, never its value."""
    if not parsed.ignored:
        return
    from opstate.observability import logger

    for position in parsed.ignored:
        logger.warning(
            "webhook secret entry ignored",
            extra={"secret_source": where, "position": position, "rule": KEY_RULE},
        )


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
    the fixed sample events. ``tolerance_s`` bounds ``|now - webhook-timestamp|``. Every secret
    must be a key (``InvalidSecretError`` otherwise); with none, ``verify`` raises
    ``SecretsUnavailableError`` (503: nothing can be verified, nothing is accepted).
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
            raise SecretsUnavailableError("no usable webhook secret is configured")
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

    The provider returns the stored value as it is (text, bytes or a list of entries) and
    caches it (Powertools Parameters ``max_age``, or a file's mtime): the value is parsed, its
    ignored entries logged and the HMAC keys rebuilt only when it changes.
    """

    def __init__(
        self,
        provider: Callable[[], str | bytes | Sequence[object]],
        tolerance_s: int = 300,
        *,
        clock_s: Callable[[], float] = time.time,
        where: str = "webhook secret",
    ) -> None:
        self._provider = provider
        self._tolerance_s = tolerance_s
        self._clock_s = clock_s
        self._where = where
        self._lock = threading.Lock()
        self._raw: object = None
        self._verifier = StaticSecretsVerifier((), tolerance_s, clock_s=clock_s)

    def _current(self) -> StaticSecretsVerifier:
        raw = self._provider()
        if not isinstance(raw, str | bytes):
            raw = tuple(raw)
        with self._lock:
            if raw != self._raw:
                parsed = parse_stored(raw)
                log_ignored_entries(parsed, self._where)
                self._verifier = StaticSecretsVerifier(
                    parsed.keys, self._tolerance_s, clock_s=self._clock_s
                )
                self._raw = raw
            return self._verifier

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        self._current().verify(raw_body, headers)


def secrets_manager_provider(secret_id: str, max_age_s: int) -> Callable[[], str | bytes]:
    """A provider of the raw value of ``secret_id`` through Powertools Parameters (cached
    ``max_age_s``)."""

    def provide() -> str | bytes:
        from aws_lambda_powertools.utilities.parameters import get_secret
        from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

        try:
            value = get_secret(secret_id, max_age=max_age_s)
        except GetParameterError as exc:
            raise SecretsUnavailableError(f"could not read the webhook secret: {exc}") from None
        if not isinstance(value, str | bytes):
            raise SecretsUnavailableError("the webhook secret value is not text")
        return value

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


DEFAULT_JWT_MAX_LIFETIME_S = 3600
DEFAULT_JWT_LEEWAY_S = 30
MAX_JWT_LENGTH = 16384


class JwtVerifier:
    """RS256 JWT in ``header`` (``Bearer <jwt>`` or the bare token).

    Verified, all through PyJWT's own options: the RS256 signature by a JWKS key named by
    ``kid``; ``aud`` equals ``audience``; ``iss`` is one of ``issuers``; ``iat`` and ``exp`` are
    present, ``iat`` is not in the future and ``exp`` not past (``leeway_s`` of clock skew
    either way); ``sub`` equals ``subject`` when one is pinned. Then two checks PyJWT has no
    option for: ``exp - iat`` is at most ``max_lifetime_s`` (a token minted to live until 2100
    is refused), and, when ``email`` is pinned, the ``email`` claim equals it with
    ``email_verified`` true. The request body is NOT covered by the token.
    """

    def __init__(
        self,
        jwks: JwksCache,
        *,
        audience: str,
        issuers: Sequence[str],
        header: str = "authorization",
        max_lifetime_s: int = DEFAULT_JWT_MAX_LIFETIME_S,
        leeway_s: int = DEFAULT_JWT_LEEWAY_S,
        subject: str | None = None,
        email: str | None = None,
    ) -> None:
        if not issuers or not all(issuers):
            raise ValueError("JWT verification needs at least one expected issuer (iss)")
        self._jwks = jwks
        self._audience = audience
        self._issuers = tuple(issuers)
        self.header = header.lower()
        self._max_lifetime_s = max_lifetime_s
        self._leeway_s = leeway_s
        self._subject = subject
        self._email = email

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        import jwt

        token = _lower(headers).get(self.header, "").strip()
        if token[:7].lower() == "bearer ":
            token = token[7:].strip()
        if not token or len(token) > MAX_JWT_LENGTH:
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
        required = ["exp", "iat", "iss", "aud"]
        if self._subject is not None:
            required.append("sub")
        if self._email is not None:
            required.append("email")
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=["RS256"],
                audience=self._audience,
                issuer=self._issuers,
                subject=self._subject,
                options={
                    "require": required,
                    "verify_signature": True,
                    "verify_exp": True,
                    "verify_iat": True,
                    "verify_iss": True,
                    "verify_aud": True,
                    "verify_sub": True,
                },
                leeway=self._leeway_s,
            )
        except jwt.PyJWTError:
            raise SignatureError() from None
        issued, expires = claims.get("iat"), claims.get("exp")
        if not _is_number(issued) or not _is_number(expires):
            raise SignatureError()
        if expires - issued > self._max_lifetime_s:
            raise SignatureError()
        if self._email is not None and (
            claims.get("email") != self._email or claims.get("email_verified") is not True
        ):
            raise SignatureError()


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


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

    Secrets Manager (``webhook_secret_arn``) wins over local ``webhook_secrets``; with neither
    (or with no usable key among them), every Standard Webhooks request answers 503. JWTs are
    accepted only with ``public_url`` set, and then ``jwt_issuers`` must be set too.
    """
    standard: Verifier
    if settings.webhook_secret_arn:
        standard = SecretsProviderVerifier(
            secrets_manager_provider(settings.webhook_secret_arn, settings.secrets_cache_s),
            settings.webhook_tolerance_s,
            clock_s=clock_s,
            where="OPSTATE_WEBHOOK_SECRET_ARN",
        )
    else:
        parsed = parse_stored(settings.webhook_secrets)
        log_ignored_entries(parsed, "OPSTATE_WEBHOOK_SECRETS")
        standard = StaticSecretsVerifier(parsed.keys, settings.webhook_tolerance_s, clock_s=clock_s)
    jwt_verifier = None
    if settings.public_url:
        if not settings.jwt_issuers:
            raise ConfigError(
                "OPSTATE_JWT_ISSUER must be set when OPSTATE_PUBLIC_URL turns on JWT verification"
            )
        jwt_verifier = JwtVerifier(
            JwksCache(settings.jwks_url),
            audience=settings.public_url,
            issuers=settings.jwt_issuers,
            header=settings.jwt_header,
            max_lifetime_s=settings.jwt_max_lifetime_s,
            leeway_s=settings.jwt_leeway_s,
            subject=settings.jwt_subject,
            email=settings.jwt_email,
        )
    return WebhookVerifier(standard, jwt_verifier)
