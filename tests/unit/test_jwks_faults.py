"""Issue 24 item 3: a failing JWKS ends in bounded time.

Before: every token with an unknown ``kid`` fetched the JWKS again and waited the full timeout
(50 junk tokens, 50 fetches; a hanging JWKS held each request 5 s), valid deliveries got 503
once the cache's TTL lapsed, and a JWT-only deployment answered 503 to HMAC-only requests.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from opstate.config import DEFAULT_JWKS_MAX_STALE_S, DEFAULT_JWKS_TIMEOUT_S, Settings
from opstate.signatures import (
    JwksCache,
    JwtVerifier,
    SecretsUnavailableError,
    SignatureError,
    verifier_from_settings,
)
from tests.support.webhooks import TEST_SECRET, signed_headers, webhook_event
from tests.unit.test_signatures import AUDIENCE, BODY, ISSUER, JwksServer, Signer

TTL_S = 3600.0


@pytest.fixture(scope="module")
def signers() -> tuple[Signer, Signer]:
    return Signer("key-1"), Signer("key-2")


@pytest.fixture
def jwks() -> Iterator[JwksServer]:
    server = JwksServer()
    try:
        yield server
    finally:
        server.stop()


def verifier(url: str, clock: list[float], **options: Any) -> tuple[JwtVerifier, JwksCache]:
    cache = JwksCache(url, ttl_s=TTL_S, clock_s=lambda: clock[0], **options)
    return JwtVerifier(cache, audience=AUDIENCE, issuers=(ISSUER,)), cache


def junk_token(signer: Signer, n: int) -> str:
    """A well-formed RS256 token naming a ``kid`` the JWKS never had."""
    import jwt

    return jwt.encode(
        {"aud": AUDIENCE, "iss": ISSUER}, signer.private, "RS256", headers={"kid": f"junk-{n}"}
    )


def test_the_defaults_are_short_and_bounded() -> None:
    settings = Settings()
    assert settings.jwks_timeout_s == DEFAULT_JWKS_TIMEOUT_S == 2.0
    assert settings.jwks_max_stale_s == DEFAULT_JWKS_MAX_STALE_S == 6 * 3600.0
    env = {"OPSTATE_JWKS_TIMEOUT_SECONDS": "0.5", "OPSTATE_JWKS_MAX_STALE_SECONDS": "60"}
    read = Settings.from_env(env)
    assert (read.jwks_timeout_s, read.jwks_max_stale_s) == (0.5, 60.0)


def test_an_unreachable_jwks_is_fetched_once_per_backoff_not_per_token(
    jwks: JwksServer, signers: tuple[Signer, Signer]
) -> None:
    jwks.broken = True
    clock = [0.0]
    jwt_verifier, cache = verifier(jwks.url, clock, backoff_s=5.0)
    for n in range(50):
        with pytest.raises(SecretsUnavailableError):
            jwt_verifier.verify(BODY, {"authorization": junk_token(signers[0], n)})
    assert jwks.fetches == 1 and cache.attempts == 1
    clock[0] = 5.0  # the backoff is over: one more attempt, then 10 s of quiet
    for n in range(10):
        with pytest.raises(SecretsUnavailableError):
            jwt_verifier.verify(BODY, {"authorization": junk_token(signers[0], n)})
    assert jwks.fetches == 2
    clock[0] = 14.0
    with pytest.raises(SecretsUnavailableError):
        jwt_verifier.verify(BODY, {"authorization": signers[0].token()})
    assert jwks.fetches == 2
    # Back up: the next attempt after the backoff reads the keys and verifies.
    jwks.broken, jwks.keys = False, [signers[0].jwk()]
    clock[0] = 15.0
    jwt_verifier.verify(BODY, {"authorization": signers[0].token()})
    assert jwks.fetches == 3 and cache.fetches == 1


def test_the_last_good_keys_are_served_while_fetches_fail_within_the_staleness_bound(
    jwks: JwksServer, signers: tuple[Signer, Signer]
) -> None:
    one, _ = signers
    jwks.keys = [one.jwk()]
    clock = [0.0]
    jwt_verifier, _ = verifier(jwks.url, clock, max_stale_s=600.0, backoff_s=5.0)
    jwt_verifier.verify(BODY, {"authorization": one.token()})
    jwks.broken = True
    clock[0] = TTL_S + 1  # the TTL lapsed and the refresh fails: still verified
    jwt_verifier.verify(BODY, {"authorization": one.token()})
    jwt_verifier.verify(BODY, {"authorization": one.token()})
    assert jwks.fetches == 2  # one failed refresh, then the backoff
    # An unknown kid meanwhile: retry later (a new key may exist), and no fetch per token.
    for n in range(20):
        with pytest.raises(SecretsUnavailableError):
            jwt_verifier.verify(BODY, {"authorization": junk_token(one, n)})
    assert jwks.fetches == 2
    clock[0] = TTL_S + 600 + 1  # past the staleness bound: nothing is verified any more
    with pytest.raises(SecretsUnavailableError):
        jwt_verifier.verify(BODY, {"authorization": one.token()})


def test_unknown_kids_with_a_healthy_jwks_refresh_at_most_once_per_interval(
    jwks: JwksServer, signers: tuple[Signer, Signer]
) -> None:
    one, _ = signers
    jwks.keys = [one.jwk()]
    clock = [0.0]
    jwt_verifier, _ = verifier(jwks.url, clock, min_refresh_s=30.0)
    jwt_verifier.verify(BODY, {"authorization": one.token()})
    for n in range(50):
        with pytest.raises(SignatureError):  # the JWKS answered: unknown is unknown (401)
            jwt_verifier.verify(BODY, {"authorization": junk_token(one, n)})
    assert jwks.fetches == 1
    clock[0] = 31.0
    for n in range(50):
        with pytest.raises(SignatureError):
            jwt_verifier.verify(BODY, {"authorization": junk_token(one, n)})
    assert jwks.fetches == 2


class HangingServer:
    """Accepts connections and never answers; counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.accepted: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/jwks.json"
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def stop(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def test_a_hanging_jwks_holds_one_request_for_the_timeout_and_the_others_not_at_all(
    signers: tuple[Signer, Signer],
) -> None:
    server = HangingServer()
    try:
        clock = [0.0]
        jwt_verifier, cache = verifier(server.url, clock, timeout_s=0.2, backoff_s=5.0)
        outcomes: list[str] = []

        def call() -> None:
            try:
                jwt_verifier.verify(BODY, {"authorization": signers[0].token()})
                outcomes.append("ok")
            except SecretsUnavailableError:
                outcomes.append("retry-later")

        threads = [threading.Thread(target=call) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert not any(t.is_alive() for t in threads)
        assert outcomes == ["retry-later"] * 10
        assert cache.attempts == 1 and len(server.accepted) == 1
        for _ in range(20):  # while backing off: answered at once, no connection
            call()
        assert cache.attempts == 1 and len(server.accepted) == 1
    finally:
        server.stop()


def test_a_jwt_only_deployment_refuses_hmac_only_requests_with_401(
    jwks: JwksServer, signers: tuple[Signer, Signer]
) -> None:
    from opstate.api import create_app
    from opstate.store import MemoryStore

    one, _ = signers
    jwks.keys = [one.jwk()]
    jwt_only = Settings(public_url=AUDIENCE, jwt_issuers=(ISSUER,), jwks_url=jwks.url)
    store = MemoryStore()
    app = create_app(store=store, verifier=verifier_from_settings(jwt_only), settings=jwt_only)
    hmac_only = app.resolve(webhook_event(BODY, signed_headers(BODY, timestamp=None)), None)
    assert hmac_only["statusCode"] == 401, hmac_only
    assert json.loads(hmac_only["body"])["error"] == "invalid-signature"
    both = {**signed_headers(BODY, timestamp=None), "authorization": f"Bearer {one.token()}"}
    assert app.resolve(webhook_event(BODY, both), None)["statusCode"] == 200
    assert jwks.fetches == 1
    # With secrets configured but unusable, HMAC requests still answer 503 (and the alarm).
    broken = Settings(
        webhook_secrets=("whsec_placeholder=",),
        public_url=AUDIENCE,
        jwt_issuers=(ISSUER,),
        jwks_url=jwks.url,
    )
    with pytest.raises(SecretsUnavailableError):
        verifier_from_settings(broken).verify(BODY, signed_headers(BODY, timestamp=None))
    # ... and a deployment with both keeps verifying HMAC deliveries.
    both_configured = Settings(
        webhook_secrets=(TEST_SECRET,),
        public_url=AUDIENCE,
        jwt_issuers=(ISSUER,),
        jwks_url=jwks.url,
    )
    verifier_from_settings(both_configured).verify(BODY, signed_headers(BODY, timestamp=None))
