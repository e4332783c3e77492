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
    parse_secret_value,
    secrets_manager_provider,
    verifier_from_settings,
)
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
    ("no secrets configured", (), BODY, VALID, False),
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


def test_secret_without_whsec_prefix_and_unpadded_is_the_same_key() -> None:
    bare = TEST_SECRET.removeprefix("whsec_").rstrip("=")
    StaticSecretsVerifier([bare], clock_s=frozen()).verify(BODY, VALID)


@pytest.mark.parametrize("secret", ["", "whsec_", "whsec_!!!!", "whsec_abc def", "whsec_a"])
def test_unusable_secrets_are_refused_at_construction(secret: str) -> None:
    with pytest.raises(InvalidSecretError):
        StaticSecretsVerifier([secret])


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


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (TEST_SECRET, (TEST_SECRET,)),
        (f"  {TEST_SECRET}\n", (TEST_SECRET,)),
        (json.dumps([TEST_SECRET, ROTATED_SECRET]), (TEST_SECRET, ROTATED_SECRET)),
        (f"{TEST_SECRET} {ROTATED_SECRET}", (TEST_SECRET, ROTATED_SECRET)),
        (TEST_SECRET.encode(), (TEST_SECRET,)),
    ],
)
def test_parse_secret_value(value: object, expected: tuple[str, ...]) -> None:
    assert parse_secret_value(value) == expected


@pytest.mark.parametrize("value", ["", "   ", "[]", "[1, 2]", "[not json", '{"a": 1}', 5])
def test_parse_secret_value_refuses(value: object) -> None:
    with pytest.raises(SecretsUnavailableError):
        parse_secret_value(value)


def test_secrets_manager_json_list(aws_secrets: Any) -> None:
    arn = aws_secrets.create_secret(
        Name="opstate/webhook-list", SecretString=json.dumps([TEST_SECRET, ROTATED_SECRET])
    )["ARN"]
    assert secrets_manager_provider(arn, 300)() == (TEST_SECRET, ROTATED_SECRET)
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

    def token(self, aud: str = "https://hooks.example.test/gemini/webhook", **claims: Any) -> str:
        now = datetime.now(tz=UTC)
        payload = {"aud": aud, "iat": now, "exp": now + timedelta(minutes=5), **claims}
        payload = {k: v for k, v in payload.items() if v is not None}
        return jwt.encode(payload, self.private, algorithm="RS256", headers={"kid": self.kid})


AUDIENCE = "https://hooks.example.test/gemini/webhook"


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


def jwt_verifier(url: str, *, min_refresh_s: float = 30.0, clock: list[float] | None = None):
    ticks = clock if clock is not None else [0.0]
    cache = JwksCache(url, min_refresh_s=min_refresh_s, clock_s=lambda: ticks[0])
    return JwtVerifier(cache, audience=AUDIENCE), cache


def test_jwt_valid_and_keys_are_cached(jwks: JwksServer, signers: tuple[Signer, Signer]) -> None:
    one, _ = signers
    jwks.keys = [one.jwk()]
    verifier, cache = jwt_verifier(jwks.url)
    verifier.verify(BODY, {"authorization": f"Bearer {one.token()}"})
    verifier.verify(BODY, {"Authorization": one.token()})  # bare token, header in any case
    assert jwks.fetches == 1
    assert cache.fetches == 1


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
    claims = {"aud": AUDIENCE, "exp": now + timedelta(minutes=5)}
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
            {"aud": AUDIENCE, "exp": datetime.now(tz=UTC) + timedelta(minutes=5)},
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
        webhook_secrets=(TEST_SECRET,), public_url=AUDIENCE, jwks_url=jwks.url, jwt_header="x-jwt"
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
    settings = Settings(webhook_secrets=(TEST_SECRET,), public_url=AUDIENCE, jwks_url=jwks.url)
    store = MemoryStore()
    app = create_app(store=store, verifier=verifier_from_settings(settings), settings=settings)
    good = app.resolve(webhook_event(BODY, {"authorization": f"Bearer {one.token()}"}), None)  # type: ignore[arg-type]
    assert good["statusCode"] == 200
    assert json.loads(good["body"])["name"] == "batches/b1"
    bad = app.resolve(webhook_event(BODY, {"authorization": f"Bearer {two.token()}"}), None)  # type: ignore[arg-type]
    assert bad["statusCode"] == 401
    assert [r.name for r in store.all()] == ["batches/b1"]
