"""Dynamic webhooks: an RS256 JWT checked against a JWKS (PyJWT, imported only when used); see
the package docstring for the rules."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeGuard

from opstate.config import DEFAULT_JWT_LEEWAY_S, DEFAULT_JWT_MAX_LIFETIME_S
from opstate.signatures.common import SecretsUnavailableError, SignatureError, lower_headers

MAX_JWT_LENGTH = 16384


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
    """RS256 JWT in ``header`` (``Bearer <jwt>`` or the bare token).

    Verified, all through PyJWT's own options: the RS256 signature by a JWKS key named by
    ``kid``; ``aud`` equals ``audience``; ``iss`` is one of ``issuers``; ``iat`` and ``exp`` are
    present, ``iat`` is not in the future and ``exp`` not past (``leeway_s`` of clock skew
    either way); ``sub`` equals ``subject`` when one is pinned. Then two checks PyJWT has no
    option for: ``exp - iat`` is at most ``max_lifetime_s`` (a token minted to live until 2100
    is refused), and, when ``email`` is pinned, the ``email`` claim equals it with
    ``email_verified`` true. The request body is NOT covered by the token.

    ``check_expiry=False`` (``opstate replay`` of a quarantined delivery, late by design) skips
    only the ``exp`` / ``iat`` checks against the clock; everything else is checked.
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
        check_expiry: bool = True,
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
        self._check_expiry = check_expiry

    def verify(self, raw_body: bytes, headers: Mapping[str, str]) -> None:
        token = self._token(headers)
        claims = self._claims(token, self._key(token))
        issued, expires = claims.get("iat"), claims.get("exp")
        if not _is_number(issued) or not _is_number(expires):
            raise SignatureError()
        if expires - issued > self._max_lifetime_s:
            raise SignatureError()
        if self._email is not None and (
            claims.get("email") != self._email or claims.get("email_verified") is not True
        ):
            raise SignatureError()

    def _token(self, headers: Mapping[str, str]) -> str:
        """The token in ``header`` (a ``Bearer`` prefix removed); ``SignatureError`` if none."""
        token = lower_headers(headers).get(self.header, "").strip()
        if token[:7].lower() == "bearer ":
            token = token[7:].strip()
        if not token or len(token) > MAX_JWT_LENGTH:
            raise SignatureError()
        return token

    def _key(self, token: str) -> Any:
        """The JWKS key the token's (unverified) header names; ``SignatureError`` if none."""
        import jwt

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
        return key

    def _claims(self, token: str, key: Any) -> dict[str, Any]:
        """The claims of a token PyJWT verified (signature, aud, iss, iat, exp, sub)."""
        import jwt

        required = ["exp", "iat", "iss", "aud"]
        if self._subject is not None:
            required.append("sub")
        if self._email is not None:
            required.append("email")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=["RS256"],
                audience=self._audience,
                issuer=self._issuers,
                subject=self._subject,
                options={
                    "require": required,
                    "verify_signature": True,
                    "verify_exp": self._check_expiry,
                    "verify_iat": self._check_expiry,
                    "verify_iss": True,
                    "verify_aud": True,
                    "verify_sub": True,
                },
                leeway=self._leeway_s,
            )
        except jwt.PyJWTError:
            raise SignatureError() from None
        return claims


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
