"""Dynamic webhooks: an RS256 JWT checked against a JWKS (PyJWT, imported only when used); see
the package docstring for the rules."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeGuard

from opstate.config import (
    DEFAULT_JWKS_MAX_STALE_S,
    DEFAULT_JWKS_TIMEOUT_S,
    DEFAULT_JWT_LEEWAY_S,
    DEFAULT_JWT_MAX_LIFETIME_S,
)
from opstate.signatures.common import SecretsUnavailableError, SignatureError, lower_headers

MAX_JWT_LENGTH = 16384
MAX_JWKS_BYTES = 1024 * 1024


class JwksCache:
    """Public keys by ``kid`` from a JWKS URL; every fault ends in bounded time.

    - Fresh for ``ttl_s`` after a good fetch; then refreshed on use.
    - A failed fetch (unreachable, slow, bad document) backs off: no other fetch for
      ``backoff_s`` after the first failure, doubling per failure up to ``max_backoff_s``.
      Meanwhile the last good keys are still served, at most ``max_stale_s`` past their TTL
      (bounded staleness); with none usable, ``SecretsUnavailableError`` at once (503, no wait).
    - An unknown ``kid`` refreshes at most once per ``min_refresh_s`` and never while backing
      off, so junk tokens cannot make every request fetch. While fetches fail it is
      ``SecretsUnavailableError`` (a new key may exist: retry later), else unknown (401).
    - A fetch waits at most ``timeout_s`` to connect and per read, ``2 * timeout_s`` in all,
      and reads at most ``MAX_JWKS_BYTES``. One thread fetches at a time; the others serve the
      cached keys meanwhile, or wait for that one fetch when they have none.
    """

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float = 3600.0,
        max_stale_s: float = DEFAULT_JWKS_MAX_STALE_S,
        min_refresh_s: float = 30.0,
        backoff_s: float = 5.0,
        max_backoff_s: float = 300.0,
        timeout_s: float = DEFAULT_JWKS_TIMEOUT_S,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self._ttl_s = ttl_s
        self._max_stale_s = max_stale_s
        self._min_refresh_s = min_refresh_s
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._timeout_s = timeout_s
        self._clock_s = clock_s
        self._cond = threading.Condition()
        self._keys: dict[str, Any] = {}
        self._fetched_at: float | None = None
        self._attempted_at: float | None = None
        self._retry_at = float("-inf")
        self._failures = 0
        self._error = ""
        self._fetching = False
        self.fetches = 0  # good fetches
        self.attempts = 0  # every fetch started

    # -- state (called with the condition held) -------------------------------------------------

    def _usable(self, now: float) -> bool:
        """Whether the cached keys may still be served (fresh, or stale within the bound)."""
        return self._fetched_at is not None and (
            now - self._fetched_at <= self._ttl_s + self._max_stale_s
        )

    def _fresh(self, now: float) -> bool:
        return self._fetched_at is not None and now - self._fetched_at <= self._ttl_s

    def _may_fetch(self, now: float, *, unknown_kid: bool) -> bool:
        if self._fetching or now < self._retry_at:
            return False
        if unknown_kid and self._attempted_at is not None:
            return now - self._attempted_at >= self._min_refresh_s
        return True

    def _unavailable(self) -> SecretsUnavailableError:
        return SecretsUnavailableError(f"could not read the JWKS: {self._error or 'no keys yet'}")

    # -- fetching ------------------------------------------------------------------------------

    def _download(self) -> dict[str, Any]:
        """The keys of the JWKS document (raises on any fault, within the time bounds)."""
        import urllib.request

        import jwt

        deadline = time.monotonic() + 2 * self._timeout_s
        chunks: list[bytes] = []
        size = 0
        with urllib.request.urlopen(self.url, timeout=self._timeout_s) as response:
            while chunk := response.read(16384):
                size += len(chunk)
                if size > MAX_JWKS_BYTES:
                    raise ValueError(f"the JWKS is larger than {MAX_JWKS_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the JWKS took longer than {2 * self._timeout_s:g} s")
                chunks.append(chunk)
        keyset = jwt.PyJWKSet.from_dict(json.loads(b"".join(chunks)))
        return {k.key_id: k for k in keyset.keys if k.key_id}

    def _refresh(self) -> None:
        """One fetch, made outside the lock; its outcome recorded under it."""
        try:
            keys: dict[str, Any] | None = self._download()
            error = ""
        except Exception as exc:  # network, timeout, JSON or key-format failure: back off
            keys, error = None, f"{type(exc).__name__}: {exc}"[:300]
        with self._cond:
            now = self._clock_s()
            self._fetching = False
            if keys is not None:
                self._keys, self._fetched_at, self.fetches = keys, now, self.fetches + 1
                self._failures, self._retry_at, self._error = 0, float("-inf"), ""
            else:
                self._failures += 1
                pause = min(self._max_backoff_s, self._backoff_s * 2 ** min(self._failures - 1, 30))
                self._retry_at, self._error = now + pause, error
            self._cond.notify_all()

    def _fetch_now(self, *, unknown_kid: bool) -> bool:
        """Start a fetch if one may start (condition held); True if this thread must make it."""
        now = self._clock_s()
        if not self._may_fetch(now, unknown_kid=unknown_kid):
            return False
        self._fetching, self._attempted_at = True, now
        self.attempts += 1
        return True

    def _wait_for_fetch(self) -> None:
        """Wait (condition held) for another thread's fetch when no keys are usable."""
        self._cond.wait_for(lambda: not self._fetching, timeout=3 * self._timeout_s)

    # -- the port ------------------------------------------------------------------------------

    def key(self, kid: str) -> Any:
        """The PyJWK for ``kid``; None when it is unknown even after a refresh;
        ``SecretsUnavailableError`` when no usable keys can be had now."""
        with self._cond:
            fetch = not self._fresh(self._clock_s()) and self._fetch_now(unknown_kid=False)
        if fetch:
            self._refresh()
        with self._cond:
            if not self._usable(self._clock_s()) and self._fetching:
                self._wait_for_fetch()
            if not self._usable(self._clock_s()):
                raise self._unavailable()
            found = self._keys.get(kid)
            if found is not None:
                return found
            fetch = self._fetch_now(unknown_kid=True)
        if fetch:
            self._refresh()
        with self._cond:
            found = self._keys.get(kid)
            if found is None and self._failures:
                raise self._unavailable()  # a new key may exist that we cannot read now
            return found


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
