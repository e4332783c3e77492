"""Standard Webhooks verification, secret sources (local, Secrets Manager) and RS256 JWTs."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from standardwebhooks.webhooks import Webhook

from opstate.config import Settings
from opstate.signatures import (
    INVALID_SIGNATURE,
    InvalidSecretError,
    JwksCache,
    JwtVerifier,
    SecretsProviderVerifier,
    SecretsUnavailableError,
    SignatureError,
    StaticSecretsVerifier,
    WebhookVerifier,
    secrets_manager_provider,
    verifier_from_settings,
)
from opstate.webhook_secrets import parse_stored
from tests.support.webhooks import OTHER_SECRET, ROTATED_SECRET, TEST_SECRET, sign

NOW = 1_800_000_000
BODY = b'{"type":"batch.succeeded","data":{"id":"batches/b1"}}'
MSG_ID = "msg_2sigtest"


def frozen(now: float = NOW) -> Callable[[], float]:
    return lambda: now


def headers_for(
    body: bytes = BODY,
    *,
    secrets: tuple[str, ...] = (TEST_SECRET,),
    msg_id: str = MSG_ID,
    timestamp: int = NOW,
) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, msg_id, timestamp, body) for s in secrets),
    }


def without(headers: dict[str, str], key: str) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k != key}


def replaced(headers: dict[str, str], **changes: str) -> dict[str, str]:
    out = dict(headers)
    for key, value in changes.items():
        out[key.replace("_", "-")] = value
    return out


VALID = headers_for()
VALID_SIG = VALID["webhook-signature"].removeprefix("v1,")

# (case id, configured secrets, body, headers, accepted?)
TABLE: list[tuple[str, tuple[str, ...], bytes, dict[str, str], bool]] = [
    ("valid", (TEST_SECRET,), BODY, VALID, True),
    (
        "second rotated secret matches",
        (TEST_SECRET, ROTATED_SECRET),
        BODY,
        headers_for(secrets=(ROTATED_SECRET,)),
        True,
    ),
    (
        "two entries, only the second matches",
        (ROTATED_SECRET,),
        BODY,
        headers_for(secrets=(TEST_SECRET, ROTATED_SECRET)),
        True,
    ),
    (
        "signed with a secret not configured",
        (TEST_SECRET,),
        BODY,
        headers_for(secrets=(OTHER_SECRET,)),
        False,
    ),
    ("tampered body", (TEST_SECRET,), BODY.replace(b"b1", b"b2"), VALID, False),
    ("body with a trailing newline", (TEST_SECRET,), BODY + b"\n", VALID, False),
    ("tampered id", (TEST_SECRET,), BODY, replaced(VALID, webhook_id="msg_other"), False),
    (
        "tampered timestamp",
        (TEST_SECRET,),
        BODY,
        replaced(VALID, webhook_timestamp=str(NOW - 1)),
        False,
    ),
    ("timestamp 301 s old", (TEST_SECRET,), BODY, headers_for(timestamp=NOW - 301), False),
    ("timestamp 301 s ahead", (TEST_SECRET,), BODY, headers_for(timestamp=NOW + 301), False),
    ("timestamp 300 s old", (TEST_SECRET,), BODY, headers_for(timestamp=NOW - 300), True),
    ("timestamp 300 s ahead", (TEST_SECRET,), BODY, headers_for(timestamp=NOW + 300), True),
    ("missing webhook-id", (TEST_SECRET,), BODY, without(VALID, "webhook-id"), False),
    (
        "missing webhook-timestamp",
        (TEST_SECRET,),
        BODY,
        without(VALID, "webhook-timestamp"),
        False,
    ),
    (
        "missing webhook-signature",
        (TEST_SECRET,),
        BODY,
        without(VALID, "webhook-signature"),
        False,
    ),
    ("no headers", (TEST_SECRET,), BODY, {}, False),
    (
        "v1a entries only (asymmetric scheme, not ours)",
        (TEST_SECRET,),
        BODY,
        replaced(VALID, webhook_signature=f"v1a,{VALID_SIG} v1a,{VALID_SIG}"),
        False,
    ),
    (
        "v2 entry only",
        (TEST_SECRET,),
        BODY,
        replaced(VALID, webhook_signature=f"v2,{VALID_SIG}"),
        False,
    ),
    (
        "malformed entries are skipped, a valid one still passes",
        (TEST_SECRET,),
        BODY,
        replaced(VALID, webhook_signature=f"v1 v1, v1,!!notbase64 garbage v1a,xx v1,{VALID_SIG}"),
        True,
    ),
    (
        "only malformed entries",
        (TEST_SECRET,),
        BODY,
        replaced(VALID, webhook_signature="v1 v1, v1,%%% ,,,"),
        False,
    ),
    (
        "signature of another length",
        (TEST_SECRET,),
        BODY,
        replaced(VALID, webhook_signature="v1," + base64.b64encode(b"short").decode()),
        False,
    ),
    (
        "fractional timestamp",
        (TEST_SECRET,),
        BODY,
        replaced(VALID, webhook_timestamp=f"{NOW}.0"),
        False,
    ),
    ("exponent timestamp", (TEST_SECRET,), BODY, replaced(VALID, webhook_timestamp="1.8e9"), False),
    ("nan timestamp", (TEST_SECRET,), BODY, replaced(VALID, webhook_timestamp="nan"), False),
    ("negative timestamp", (TEST_SECRET,), BODY, replaced(VALID, webhook_timestamp="-1"), False),
    ("huge timestamp", (TEST_SECRET,), BODY, replaced(VALID, webhook_timestamp="9" * 40), False),
    ("empty id", (TEST_SECRET,), BODY, replaced(VALID, webhook_id=""), False),
    (
        "header names in any case",
        (TEST_SECRET,),
        BODY,
        {k.title(): v for k, v in VALID.items()},
        True,
    ),
]


@pytest.mark.parametrize(
    ("secrets", "body", "headers", "accepted"),
    [case[1:] for case in TABLE],
    ids=[case[0] for case in TABLE],
)
def test_signature_table(
    secrets: tuple[str, ...], body: bytes, headers: dict[str, str], accepted: bool
) -> None:
    verifier = StaticSecretsVerifier(secrets, tolerance_s=300, clock_s=frozen())
    if accepted:
        verifier.verify(body, headers)
    else:
        with pytest.raises(SignatureError) as info:
            verifier.verify(body, headers)
        # Never says which check failed.
        assert str(info.value) == INVALID_SIGNATURE


def test_non_utf8_body_is_refused_not_crashed() -> None:
    body = b"\xff\xfe{}"
    verifier = StaticSecretsVerifier([TEST_SECRET], clock_s=frozen())
    with pytest.raises(SignatureError):
        verifier.verify(body, headers_for(body))


def test_tolerance_is_configurable() -> None:
    headers = headers_for(timestamp=NOW - 3600)
    with pytest.raises(SignatureError):
        StaticSecretsVerifier([TEST_SECRET], tolerance_s=300, clock_s=frozen()).verify(
            BODY, headers
        )
    StaticSecretsVerifier([TEST_SECRET], tolerance_s=3600, clock_s=frozen()).verify(BODY, headers)


def test_independent_signer_agrees_with_the_standardwebhooks_package() -> None:
    # The package's own verify (wall clock, fixed 5 min) accepts what our test signer produced,
    # and its sign() produces the same entry: the table above tests the real scheme.
    now = int(time.time())
    headers = headers_for(timestamp=now)
    assert Webhook(TEST_SECRET).verify(BODY, headers) == json.loads(BODY)
    when = datetime.fromtimestamp(now, tz=UTC)
    assert Webhook(TEST_SECRET).sign(MSG_ID, when, BODY.decode()) == headers["webhook-signature"]
    StaticSecretsVerifier([TEST_SECRET]).verify(BODY, headers)


def test_unpadded_secret_is_the_same_key() -> None:
    unpadded = TEST_SECRET.rstrip("=")
    StaticSecretsVerifier([unpadded], clock_s=frozen()).verify(BODY, VALID)


def test_no_secrets_configured_is_retry_later_never_accepted() -> None:
    verifier = StaticSecretsVerifier((), clock_s=frozen())
    for headers in (VALID, {}, headers_for(secrets=(OTHER_SECRET,))):
        with pytest.raises(SecretsUnavailableError):
            verifier.verify(BODY, headers)


SHORT_KEY = "whsec_" + base64.b64encode(b"x" * 23).decode()  # 23 bytes: one short


@pytest.mark.parametrize(
    "secret",
    [
        "",
        "whsec_",
        "whsec_!!!!",
        "whsec_abc def",
        "whsec_a",
        "whsec_ab",  # a one-byte key: found by brute force in ~128 tries
        "placeholder",
        "CHANGEME",
        TEST_SECRET.removeprefix("whsec_"),  # bare base64: not the rule's shape
        SHORT_KEY,
    ],
)
def test_unusable_secrets_are_refused_at_construction(secret: str) -> None:
    with pytest.raises(InvalidSecretError):
        StaticSecretsVerifier([secret])


def test_a_24_byte_key_is_the_shortest_accepted() -> None:
    key24 = "whsec_" + base64.b64encode(b"y" * 24).decode()
    StaticSecretsVerifier([key24], clock_s=frozen()).verify(BODY, headers_for(secrets=(key24,)))


# --- secret providers ----------------------------------------------------------------------------


def test_provider_verifier_picks_up_a_rotation() -> None:
    current: list[tuple[str, ...]] = [(TEST_SECRET,)]
    verifier = SecretsProviderVerifier(lambda: current[0], clock_s=frozen())
    rotated_headers = headers_for(secrets=(ROTATED_SECRET,))
    verifier.verify(BODY, VALID)
    with pytest.raises(SignatureError):
        verifier.verify(BODY, rotated_headers)
    current[0] = (TEST_SECRET, ROTATED_SECRET)  # rotation window: both valid
    verifier.verify(BODY, VALID)
    verifier.verify(BODY, rotated_headers)
    current[0] = (ROTATED_SECRET,)  # old secret retired
    verifier.verify(BODY, rotated_headers)
    with pytest.raises(SignatureError):
        verifier.verify(BODY, VALID)


def test_provider_verifier_turns_an_unusable_secret_into_retry_later() -> None:
    verifier = SecretsProviderVerifier(lambda: ("whsec_!!!",), clock_s=frozen())
    with pytest.raises(SecretsUnavailableError):
        verifier.verify(BODY, VALID)


def test_secrets_manager_json_list(aws_secrets: Any) -> None:
    arn = aws_secrets.create_secret(
        Name="opstate/webhook-list", SecretString=json.dumps([TEST_SECRET, ROTATED_SECRET])
    )["ARN"]
    assert parse_stored(secrets_manager_provider(arn, 300)()).keys == (TEST_SECRET, ROTATED_SECRET)
    settings = Settings(webhook_secret_arn=arn)
    verifier = verifier_from_settings(settings, clock_s=frozen())
    verifier.verify(BODY, VALID)
    verifier.verify(BODY, headers_for(secrets=(ROTATED_SECRET,)))


def test_secrets_manager_single_string(aws_secrets: Any) -> None:
    arn = aws_secrets.create_secret(Name="opstate/webhook-one", SecretString=TEST_SECRET)["ARN"]
    verifier = verifier_from_settings(Settings(webhook_secret_arn=arn), clock_s=frozen())
    verifier.verify(BODY, VALID)
    with pytest.raises(SignatureError):
        verifier.verify(BODY, headers_for(secrets=(ROTATED_SECRET,)))


def test_secrets_manager_rotation_is_picked_up_when_the_cache_expires(aws_secrets: Any) -> None:
    arn = aws_secrets.create_secret(Name="opstate/webhook-rot", SecretString=TEST_SECRET)["ARN"]
    verifier = SecretsProviderVerifier(secrets_manager_provider(arn, 1), clock_s=frozen())
    rotated_headers = headers_for(secrets=(ROTATED_SECRET,))
    verifier.verify(BODY, VALID)
    aws_secrets.put_secret_value(SecretId=arn, SecretString=ROTATED_SECRET)
    # Still cached: the old secret works, the new one does not yet.
    verifier.verify(BODY, VALID)
    with pytest.raises(SignatureError):
        verifier.verify(BODY, rotated_headers)
    time.sleep(1.1)  # the cache age is 1 s
    verifier.verify(BODY, rotated_headers)
    with pytest.raises(SignatureError):
        verifier.verify(BODY, VALID)


def test_secrets_manager_missing_secret_is_retry_later(aws_secrets: Any) -> None:
    provider = secrets_manager_provider(
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:nope", 300
    )
    with pytest.raises(SecretsUnavailableError):
        provider()


def test_local_secrets_from_settings() -> None:
    settings = Settings.from_env({"OPSTATE_WEBHOOK_SECRETS": f"{OTHER_SECRET} {TEST_SECRET}"})
    verifier = verifier_from_settings(settings, clock_s=frozen())
    assert isinstance(verifier.standard, StaticSecretsVerifier)
    assert verifier.standard.secret_count == 2
    assert verifier.jwt is None  # off unless OPSTATE_PUBLIC_URL is set
    verifier.verify(BODY, VALID)


# --- JWT (dynamic webhooks) ----------------------------------------------------------------------


class JwksServer:
    """A JWKS document on 127.0.0.1 whose keys a test can change; counts fetches."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.fetches = 0
        self.broken = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.fetches += 1
                if server.broken:
                    self.send_response(500)
                    self.end_headers()
                    return
                body = json.dumps({"keys": server.keys}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/jwks.json"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


class Signer:
    def __init__(self, kid: str) -> None:
        self.kid = kid
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwk(self) -> dict[str, Any]:
        data: dict[str, Any] = jwt.algorithms.RSAAlgorithm.to_jwk(
            self.private.public_key(), as_dict=True
        )
        return {**data, "kid": self.kid, "alg": "RS256", "use": "sig"}

    def token(
        self, aud: str | None = "https://hooks.example.test/gemini/webhook", **claims: Any
    ) -> str:
        now = datetime.now(tz=UTC)
        payload = {
            "aud": aud,
            "iss": ISSUER,
            "iat": now,
            "exp": now + timedelta(minutes=5),
            **claims,
        }
        payload = {k: v for k, v in payload.items() if v is not None}
        return jwt.encode(payload, self.private, algorithm="RS256", headers={"kid": self.kid})


AUDIENCE = "https://hooks.example.test/gemini/webhook"
ISSUER = "https://accounts.example.test"


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


def jwt_verifier(
    url: str, *, min_refresh_s: float = 30.0, clock: list[float] | None = None, **options: Any
) -> tuple[JwtVerifier, JwksCache]:
    ticks = clock if clock is not None else [0.0]
    cache = JwksCache(url, min_refresh_s=min_refresh_s, clock_s=lambda: ticks[0])
    return JwtVerifier(cache, audience=AUDIENCE, issuers=(ISSUER,), **options), cache


def test_jwt_valid_and_keys_are_cached(jwks: JwksServer, signers: tuple[Signer, Signer]) -> None:
    one, _ = signers
    jwks.keys = [one.jwk()]
    verifier, cache = jwt_verifier(jwks.url)
    verifier.verify(BODY, {"authorization": f"Bearer {one.token()}"})
    verifier.verify(BODY, {"Authorization": one.token()})  # bare token, header in any case
    assert jwks.fetches == 1
    assert cache.fetches == 1


def test_jwt_replaying_skips_only_the_expiry(
    jwks: JwksServer, signers: tuple[Signer, Signer]
) -> None:
    """Issue 24: a quarantined JWT delivery is verified again on replay, late by design: its
    token's exp/iat are not held against the clock; signature, aud, iss and lifetime are."""
    one, two = signers
    jwks.keys = [one.jwk()]
    past = datetime.now(tz=UTC) - timedelta(days=2)
    expired = one.token(iat=past, exp=past + timedelta(minutes=5))
    live, _ = jwt_verifier(jwks.url)
    with pytest.raises(SignatureError):
        live.verify(BODY, {"authorization": expired})
    late, _ = jwt_verifier(jwks.url, check_expiry=False)
    late.verify(BODY, {"authorization": expired})
    for forged in (
        two.token(iat=past, exp=past + timedelta(minutes=5)),  # a key not in the JWKS
        one.token(aud="https://elsewhere.test/hook", iat=past, exp=past + timedelta(minutes=5)),
        one.token(iat=past, exp=past + timedelta(days=1)),  # longer than the lifetime bound
    ):
        with pytest.raises(SignatureError):
            late.verify(BODY, {"authorization": forged})


def test_jwt_unknown_kid_refreshes_once_and_finds_a_new_key(
    jwks: JwksServer, signers: tuple[Signer, Signer]
) -> None:
    one, two = signers
    jwks.keys = [one.jwk()]
    clock = [0.0]
    verifier, _ = jwt_verifier(jwks.url, clock=clock)
    verifier.verify(BODY, {"authorization": one.token()})
    assert jwks.fetches == 1
    jwks.keys = [one.jwk(), two.jwk()]  # Google rotated in a new key
    clock[0] = 60.0
    verifier.verify(BODY, {"authorization": two.token()})
    assert jwks.fetches == 2


def test_jwt_unknown_kid_is_refused_after_one_refresh(
    jwks: JwksServer, signers: tuple[Signer, Signer]
) -> None:
    one, two = signers
    jwks.keys = [one.jwk()]
    clock = [0.0]
    verifier, _ = jwt_verifier(jwks.url, clock=clock)
    verifier.verify(BODY, {"authorization": one.token()})
    clock[0] = 60.0
    with pytest.raises(SignatureError):
        verifier.verify(BODY, {"authorization": two.token()})
    assert jwks.fetches == 2  # exactly one refresh
    # Another unknown kid right after: no further fetch (bounded refreshes).
    with pytest.raises(SignatureError):
        verifier.verify(BODY, {"authorization": two.token()})
    assert jwks.fetches == 2


def _hs256_token() -> str:
    now = datetime.now(tz=UTC)
    claims = {"aud": AUDIENCE, "iss": ISSUER, "iat": now, "exp": now + timedelta(minutes=5)}
    return jwt.encode(claims, "k" * 32, algorithm="HS256", headers={"kid": "key-1"})


JWT_REFUSALS: list[tuple[str, Callable[[Signer, Signer], str]]] = [
    ("wrong audience", lambda one, _: one.token(aud="https://elsewhere.example.test/hook")),
    ("expired", lambda one, _: one.token(exp=datetime.now(tz=UTC) - timedelta(minutes=10))),
    ("no exp claim", lambda one, _: one.token(exp=None)),
    ("no aud claim", lambda one, _: one.token(aud=None)),
    ("HS256 (algorithm confusion)", lambda one, _: _hs256_token()),
    (
        "signed by another key under a known kid",
        lambda one, two: jwt.encode(
            {
                "aud": AUDIENCE,
                "iss": ISSUER,
                "iat": datetime.now(tz=UTC),
                "exp": datetime.now(tz=UTC) + timedelta(minutes=5),
            },
            two.private,
            algorithm="RS256",
            headers={"kid": one.kid},
        ),
    ),
    ("tampered payload", lambda one, _: _tamper(one.token())),
    ("not a JWT", lambda one, _: "not-a-jwt"),
    ("empty", lambda one, _: ""),
]


def _tamper(token: str) -> str:
    head, payload, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["aud"] = AUDIENCE + "/other"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{head}.{forged}.{sig}"


@pytest.mark.parametrize("make", [m for _, m in JWT_REFUSALS], ids=[i for i, _ in JWT_REFUSALS])
def test_jwt_refusals(
    jwks: JwksServer, signers: tuple[Signer, Signer], make: Callable[[Signer, Signer], str]
) -> None:
    one, two = signers
    jwks.keys = [one.jwk()]
    verifier, _ = jwt_verifier(jwks.url)
    with pytest.raises(SignatureError) as info:
        verifier.verify(BODY, {"authorization": f"Bearer {make(one, two)}"})
    assert str(info.value) == INVALID_SIGNATURE


def test_jwks_unreachable_is_retry_later(jwks: JwksServer, signers: tuple[Signer, Signer]) -> None:
    jwks.broken = True
    verifier, _ = jwt_verifier(jwks.url)
    with pytest.raises(SecretsUnavailableError):
        verifier.verify(BODY, {"authorization": signers[0].token()})


def test_webhook_verifier_dispatch(jwks: JwksServer, signers: tuple[Signer, Signer]) -> None:
    one, _ = signers
    jwks.keys = [one.jwk()]
    settings = Settings(
        webhook_secrets=(TEST_SECRET,),
        public_url=AUDIENCE,
        jwt_issuers=(ISSUER,),
        jwks_url=jwks.url,
        jwt_header="x-jwt",
    )
    verifier = verifier_from_settings(settings, clock_s=frozen())
    assert verifier.jwt is not None
    verifier.verify(BODY, VALID)  # Standard Webhooks headers win
    verifier.verify(BODY, {"X-JWT": f"Bearer {one.token()}"})
    with pytest.raises(SignatureError):
        verifier.verify(BODY, {"authorization": f"Bearer {one.token()}"})  # not the header
    with pytest.raises(SignatureError):
        verifier.verify(BODY, {})
    # A bad Standard Webhooks signature is not rescued by a valid JWT.
    bad = {**headers_for(secrets=(OTHER_SECRET,)), "x-jwt": one.token()}
    with pytest.raises(SignatureError):
        verifier.verify(BODY, bad)
    # Without OPSTATE_PUBLIC_URL, JWTs are never accepted.
    off = WebhookVerifier(StaticSecretsVerifier([TEST_SECRET], clock_s=frozen()))
    with pytest.raises(SignatureError):
        off.verify(BODY, {"authorization": f"Bearer {one.token()}"})


def test_jwt_webhook_through_the_api(jwks: JwksServer, signers: tuple[Signer, Signer]) -> None:
    from opstate.api import create_app
    from opstate.store import MemoryStore
    from tests.support.webhooks import webhook_event

    one, two = signers
    jwks.keys = [one.jwk()]
    settings = Settings(
        webhook_secrets=(TEST_SECRET,),
        public_url=AUDIENCE,
        jwt_issuers=(ISSUER,),
        jwks_url=jwks.url,
    )
    store = MemoryStore()
    app = create_app(store=store, verifier=verifier_from_settings(settings), settings=settings)
    good = app.resolve(webhook_event(BODY, {"authorization": f"Bearer {one.token()}"}), None)  # type: ignore[arg-type]
    assert good["statusCode"] == 200
    assert json.loads(good["body"])["name"] == "batches/b1"
    bad = app.resolve(webhook_event(BODY, {"authorization": f"Bearer {two.token()}"}), None)  # type: ignore[arg-type]
    assert bad["statusCode"] == 401
    assert [r.name for r in store.all()] == ["batches/b1"]


# --- issue 12 item 1: one rule for stored secrets, on every path ---------------------------------

# What the old parser made of a placeholder: base64decode("placeholder=") is an 8-byte HMAC key.
PLACEHOLDER_FORGERY_KEY = "whsec_placeholder="


@pytest.fixture
def logs() -> Iterator[Callable[[], str]]:
    """The JSON log lines the Powertools logger writes during the test."""
    import io
    import logging

    from opstate.observability import SERVICE, logger

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logger.registered_formatter)
    std = logging.getLogger(SERVICE)
    std.addHandler(handler)
    try:
        yield stream.getvalue
    finally:
        std.removeHandler(handler)


@pytest.fixture
def buffered_metrics() -> Iterator[dict[str, Any]]:
    from opstate.observability import metrics

    metrics.clear_metrics()
    try:
        yield metrics.metric_set
    finally:
        metrics.clear_metrics()


def _app_over_secret(aws_secrets: Any, name: str, value: str) -> tuple[Any, Any]:
    from opstate.api import create_app
    from opstate.store import MemoryStore

    arn = aws_secrets.create_secret(Name=name, SecretString=value)["ARN"]
    settings = Settings(webhook_secret_arn=arn)
    store = MemoryStore()
    app = create_app(
        store=store, verifier=verifier_from_settings(settings, clock_s=frozen()), settings=settings
    )
    return app, store


@pytest.mark.parametrize(
    ("value", "status"),
    [
        ('["placeholder"]', 503),
        (json.dumps([TEST_SECRET, "placeholder"]), 401),
        ("CHANGEME", 503),
        ("placeholder", 503),
    ],
    ids=["list-placeholder", "key-and-placeholder", "changeme", "bare-placeholder"],
)
def test_placeholder_secrets_never_verify_a_forgery(
    aws_secrets: Any, value: str, status: int
) -> None:
    from tests.support.webhooks import webhook_event

    app, store = _app_over_secret(aws_secrets, f"opstate/forgery-{status}-{len(value)}", value)
    forged = headers_for(secrets=(PLACEHOLDER_FORGERY_KEY,))
    answer = app.resolve(webhook_event(BODY, forged), None)
    assert answer["statusCode"] == status
    assert store.all() == []
    if status == 503:
        assert answer["headers"]["Retry-After"]
    else:  # the real key still works next to the ignored entry
        assert app.resolve(webhook_event(BODY, VALID), None)["statusCode"] == 200


def test_no_usable_key_answers_503_and_counts_for_the_secrets_alarm(
    aws_secrets: Any, logs: Callable[[], str], buffered_metrics: dict[str, Any]
) -> None:
    from tests.support.webhooks import webhook_event

    app, store = _app_over_secret(aws_secrets, "opstate/no-key", '["placeholder", "#x"]')
    answer = app.resolve(webhook_event(BODY, VALID), None)
    assert answer["statusCode"] == 503
    assert store.all() == []
    assert json.loads(answer["body"])["error"] == "unavailable"
    out = logs()
    # StoreUnavailable is the metric the StoreUnavailableAlarm watches (template.yaml).
    assert "StoreUnavailable" in buffered_metrics
    assert "webhook secret entry ignored" in out
    warnings = [
        json.loads(line)
        for line in out.splitlines()
        if line.startswith("{") and "webhook secret entry ignored" in line
    ]
    assert [w["position"] for w in warnings] == ["entry 1"]
    assert warnings[0]["secret_source"] == "OPSTATE_WEBHOOK_SECRET_ARN"
    assert "placeholder" not in out  # never the value


def test_ignored_entries_are_warned_once_per_value_change(logs: Callable[[], str]) -> None:
    value = [f"{TEST_SECRET} CHANGEME"]
    verifier = SecretsProviderVerifier(lambda: value[0], clock_s=frozen(), where="test")
    verifier.verify(BODY, VALID)
    verifier.verify(BODY, VALID)
    out = logs()
    assert out.count("webhook secret entry ignored") == 1
    assert "CHANGEME" not in out


def test_local_env_secrets_follow_the_same_rule(logs: Callable[[], str]) -> None:
    settings = Settings.from_env({"OPSTATE_WEBHOOK_SECRETS": f"placeholder {TEST_SECRET} ab"})
    verifier = verifier_from_settings(settings, clock_s=frozen())
    assert isinstance(verifier.standard, StaticSecretsVerifier)
    assert verifier.standard.secret_count == 1
    verifier.verify(BODY, VALID)
    with pytest.raises(SignatureError):
        verifier.verify(BODY, headers_for(secrets=(PLACEHOLDER_FORGERY_KEY,)))
    out = logs()
    assert out.count("webhook secret entry ignored") == 2
    only_junk = verifier_from_settings(
        Settings.from_env({"OPSTATE_WEBHOOK_SECRETS": "CHANGEME"}), clock_s=frozen()
    )
    with pytest.raises(SecretsUnavailableError):
        only_junk.verify(BODY, VALID)


def test_a_commented_secret_file_verifies_with_its_keys_only(tmp_path: Any) -> None:
    from opstate.webhook_secrets import SecretFileReader

    path = tmp_path / "webhook-secret"
    path.write_text(f"# current secret\n{TEST_SECRET}\n# rotated 2026-05-10, old one below\n")
    path.chmod(0o600)  # a secret file follows opstate.private_files' rule
    verifier = SecretsProviderVerifier(SecretFileReader(path), clock_s=frozen())
    verifier.verify(BODY, VALID)  # punctuation in a comment no longer means 503
    for word in ("current", "secret", "rotated", "old"):
        forged = headers_for(secrets=(f"whsec_{word}{'=' * (-len(word) % 4)}",))
        with pytest.raises(SignatureError):
            verifier.verify(BODY, forged)


def test_stored_value_that_is_not_utf8(aws_secrets: Any) -> None:
    from opstate.webhook_secrets import parse_stored

    arn = aws_secrets.create_secret(
        Name="opstate/binary", SecretBinary=b"# caf\xe9\n" + TEST_SECRET.encode()
    )["ARN"]
    verifier = verifier_from_settings(Settings(webhook_secret_arn=arn), clock_s=frozen())
    verifier.verify(BODY, VALID)
    raw = TEST_SECRET.encode()
    assert parse_stored(raw[:9] + b"\x80" + raw[9:]).keys == ()
    unreadable = SecretsProviderVerifier(lambda: raw[:9] + b"\x80" + raw[9:], clock_s=frozen())
    with pytest.raises(SecretsUnavailableError):
        unreadable.verify(BODY, VALID)


# --- issue 12 item 9: the bounds a weaker check would pass ---------------------------------------


def test_webhook_id_bound_is_256_characters() -> None:
    verifier = StaticSecretsVerifier([TEST_SECRET], clock_s=frozen())
    verifier.verify(BODY, headers_for(msg_id="m" * 256))
    with pytest.raises(SignatureError):
        verifier.verify(BODY, headers_for(msg_id="m" * 257))
    with pytest.raises(SignatureError):
        verifier.verify(BODY, headers_for(msg_id="m" * 5000))


def _padded_signature(length: int) -> dict[str, str]:
    headers = headers_for()
    entry = headers["webhook-signature"]
    filler = "v2," + "A" * (length - len(entry) - 4)
    headers["webhook-signature"] = f"{entry} {filler}"
    assert len(headers["webhook-signature"]) == length
    return headers


def test_signature_header_bound_is_4096_characters() -> None:
    verifier = StaticSecretsVerifier([TEST_SECRET], clock_s=frozen())
    verifier.verify(BODY, _padded_signature(4096))
    with pytest.raises(SignatureError):
        verifier.verify(BODY, _padded_signature(4097))


def test_only_the_first_16_signature_entries_are_tried() -> None:
    """A sender cannot make us try an unbounded number of entries: the valid one as the 16th
    counts, as the 17th it does not."""
    verifier = StaticSecretsVerifier([TEST_SECRET], clock_s=frozen())
    decoy = "v1," + base64.b64encode(b"\0" * 32).decode()

    def with_valid_at(position: int) -> dict[str, str]:
        headers = headers_for()
        entries = [decoy] * (position - 1) + [headers["webhook-signature"]]
        headers["webhook-signature"] = " ".join(entries)
        return headers

    verifier.verify(BODY, with_valid_at(16))
    with pytest.raises(SignatureError):
        verifier.verify(BODY, with_valid_at(17))


@pytest.mark.parametrize("junk", ["!", "*", "-", "_", " "])
def test_signature_base64_is_validated_strictly(junk: str) -> None:
    """A lenient decoder would drop the junk character and find the valid signature."""
    verifier = StaticSecretsVerifier([TEST_SECRET], clock_s=frozen())
    broken = f"v1,{VALID_SIG[:10]}{junk}{VALID_SIG[10:]}"
    with pytest.raises(SignatureError):
        verifier.verify(BODY, replaced(VALID, webhook_signature=broken))


def test_tolerance_applies_on_the_secrets_manager_path(aws_secrets: Any) -> None:
    arn = aws_secrets.create_secret(Name="opstate/tolerance", SecretString=TEST_SECRET)["ARN"]
    wide = verifier_from_settings(
        Settings(webhook_secret_arn=arn, webhook_tolerance_s=3600), clock_s=frozen()
    )
    wide.verify(BODY, headers_for(timestamp=NOW - 3000))
    narrow = verifier_from_settings(
        Settings(webhook_secret_arn=arn, webhook_tolerance_s=60), clock_s=frozen()
    )
    narrow.verify(BODY, headers_for(timestamp=NOW - 60))
    with pytest.raises(SignatureError):
        narrow.verify(BODY, headers_for(timestamp=NOW - 120))
    with pytest.raises(SignatureError):
        narrow.verify(BODY, headers_for(timestamp=NOW + 120))


# --- issue 12 item 2: what a dynamic-webhook JWT must carry --------------------------------------


def _now() -> datetime:
    return datetime.now(tz=UTC)


JWT_CLAIM_REFUSALS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("another issuer", {"iss": "https://accounts.google.com"}, {}),
    ("no iss claim", {"iss": None}, {}),
    ("no iat claim", {"iat": None}, {}),
    ("exp in 2100", {"exp": datetime(2100, 1, 1, tzinfo=UTC)}, {}),
    ("lifetime one second over", {"exp": None}, {"lifetime": 3601}),
    ("iat in the future", {"iat": None}, {"iat_offset": 600}),
    ("expired beyond the leeway", {"exp": None}, {"exp_offset": -120}),
    ("another subject than the pinned one", {"sub": "intruder"}, {"pin_sub": "gemini"}),
    ("no subject when one is pinned", {"sub": None}, {"pin_sub": "gemini"}),
    (
        "another email than the pinned one",
        {"email": "x@example.test", "email_verified": True},
        {"pin_email": "hooks@example.test"},
    ),
    (
        "pinned email not verified",
        {"email": "hooks@example.test", "email_verified": False},
        {"pin_email": "hooks@example.test"},
    ),
]


def _claims(claims: dict[str, Any], special: dict[str, Any]) -> dict[str, Any]:
    now = int(_now().timestamp())
    out = dict(claims)
    if "lifetime" in special:
        out["iat"] = now - 10
        out["exp"] = now - 10 + special["lifetime"]
    if "iat_offset" in special:
        out["iat"] = now + special["iat_offset"]
        out["exp"] = now + special["iat_offset"] + 60
    if "exp_offset" in special:
        out["iat"] = now - 600
        out["exp"] = now + special["exp_offset"]
    return out


@pytest.mark.parametrize(
    ("claims", "special"),
    [(c, s) for _, c, s in JWT_CLAIM_REFUSALS],
    ids=[i for i, _, _ in JWT_CLAIM_REFUSALS],
)
def test_jwt_claims_refused(
    jwks: JwksServer,
    signers: tuple[Signer, Signer],
    claims: dict[str, Any],
    special: dict[str, Any],
) -> None:
    one, _ = signers
    jwks.keys = [one.jwk()]
    verifier, _ = jwt_verifier(
        jwks.url, subject=special.get("pin_sub"), email=special.get("pin_email")
    )
    token = one.token(**_claims(claims, special))
    with pytest.raises(SignatureError) as info:
        verifier.verify(BODY, {"authorization": f"Bearer {token}"})
    assert str(info.value) == INVALID_SIGNATURE


def test_jwt_claims_accepted_at_the_edges(jwks: JwksServer, signers: tuple[Signer, Signer]) -> None:
    one, _ = signers
    jwks.keys = [one.jwk()]
    now = int(_now().timestamp())
    verifier, _ = jwt_verifier(jwks.url)
    # Exactly the maximum lifetime (1 h by default).
    verifier.verify(BODY, {"authorization": one.token(iat=now - 10, exp=now - 10 + 3600)})
    # Within the leeway (30 s by default; the margins are minutes wide of any slow run).
    verifier.verify(BODY, {"authorization": one.token(iat=now + 5, exp=now + 65)})
    # Any of several configured issuers.
    two_issuers = JwtVerifier(
        JwksCache(jwks.url), audience=AUDIENCE, issuers=("https://other.example.test", ISSUER)
    )
    two_issuers.verify(BODY, {"authorization": one.token()})
    # Pinned subject and email.
    pinned, _ = jwt_verifier(jwks.url, subject="gemini", email="hooks@example.test")
    pinned.verify(
        BODY,
        {"authorization": one.token(sub="gemini", email="hooks@example.test", email_verified=True)},
    )
    longer, _ = jwt_verifier(jwks.url, max_lifetime_s=7200)
    longer.verify(BODY, {"authorization": one.token(iat=now - 10, exp=now + 7000)})


def test_jwt_needs_an_issuer_when_on() -> None:
    from opstate.config import ConfigError

    with pytest.raises(ConfigError, match="OPSTATE_JWT_ISSUER"):
        Settings.from_env({"OPSTATE_PUBLIC_URL": AUDIENCE})
    with pytest.raises(ConfigError, match="OPSTATE_JWT_ISSUER"):
        verifier_from_settings(Settings(webhook_secrets=(TEST_SECRET,), public_url=AUDIENCE))
    with pytest.raises(ValueError):
        JwtVerifier(JwksCache("http://127.0.0.1:9/jwks"), audience=AUDIENCE, issuers=())
    settings = Settings.from_env(
        {
            "OPSTATE_PUBLIC_URL": AUDIENCE,
            "OPSTATE_JWT_ISSUER": f"{ISSUER}, https://b.example.test",
            "OPSTATE_JWT_MAX_LIFETIME_SECONDS": "600",
            "OPSTATE_JWT_LEEWAY_SECONDS": "10",
            "OPSTATE_JWT_SUBJECT": "gemini",
            "OPSTATE_JWT_EMAIL": "hooks@example.test",
        }
    )
    assert settings.jwt_issuers == (ISSUER, "https://b.example.test")
    assert (settings.jwt_max_lifetime_s, settings.jwt_leeway_s) == (600, 10)
    assert (settings.jwt_subject, settings.jwt_email) == ("gemini", "hooks@example.test")
    with pytest.raises(ConfigError, match="OPSTATE_JWT_LEEWAY_SECONDS"):
        Settings.from_env({"OPSTATE_JWT_LEEWAY_SECONDS": "3600"})


def test_jwt_settings_reach_the_verifier(jwks: JwksServer, signers: tuple[Signer, Signer]) -> None:
    one, _ = signers
    jwks.keys = [one.jwk()]
    env = {
        "OPSTATE_WEBHOOK_SECRETS": TEST_SECRET,
        "OPSTATE_PUBLIC_URL": AUDIENCE,
        "OPSTATE_JWKS_URL": jwks.url,
        "OPSTATE_JWT_ISSUER": ISSUER,
        "OPSTATE_JWT_MAX_LIFETIME_SECONDS": "600",
        "OPSTATE_JWT_SUBJECT": "gemini",
    }
    verifier = verifier_from_settings(Settings.from_env(env), clock_s=frozen())
    now = int(_now().timestamp())
    verifier.verify(BODY, {"authorization": one.token(sub="gemini", iat=now, exp=now + 600)})
    for token in (
        one.token(sub="gemini", iat=now, exp=now + 601),  # over the configured lifetime
        one.token(sub="other", iat=now, exp=now + 60),  # not the pinned subject
        one.token(sub="gemini", iss="https://evil.example.test"),
    ):
        with pytest.raises(SignatureError):
            verifier.verify(BODY, {"authorization": token})


def test_a_jwt_of_16384_characters_is_read_and_a_longer_one_is_not(
    jwks: JwksServer, signers: tuple[Signer, Signer]
) -> None:
    """The length bound is exact: a valid token of exactly the bound passes; one character more
    is refused before any key lookup (docs/security.md: at most 16 KiB)."""
    bound = 16 * 1024
    one, _ = signers
    # base64url never ends a segment on some lengths: kids of 4 lengths cover every total.
    kin = []
    for j in range(4):
        signer = Signer.__new__(Signer)
        signer.kid, signer.private = one.kid + "x" * j, one.private
        kin.append(signer)
    jwks.keys = [signer.jwk() for signer in kin]
    verifier, _ = jwt_verifier(jwks.url)

    def of_length(length: int) -> str:
        for signer in kin:
            start = signer.token(filler="x" * 11_000)
            guess = 11_000 + (length - len(start)) * 3 // 4
            for n in range(guess - 4, guess + 5):
                token = signer.token(filler="x" * n)
                if len(token) == length:
                    return token
        raise AssertionError(f"no token of {length} characters")

    verifier.verify(BODY, {"authorization": of_length(bound)})
    fetched = jwks.fetches
    with pytest.raises(SignatureError):
        verifier.verify(BODY, {"authorization": of_length(bound + 1)})
    assert jwks.fetches == fetched
