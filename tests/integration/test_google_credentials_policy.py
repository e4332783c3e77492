"""The Google credentials JSON is no way out (issue 31): what ``cloud_credentials_policy``
refuses is refused before google-auth reads a file or sends a request, through the real
``load_credentials`` and ``GoogleCloudGateway`` against the fake's Cloud endpoints; a refusing
endpoint's body never reaches an error or a log line."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.reconcile.cloud_credentials import CredentialsError, load_credentials
from opstate.reconcile.cloud_credentials_policy import (
    AWS_VERIFICATION_URL,
    GOOGLE_STS_TOKEN_URL,
    IAM_CREDENTIALS_PREFIX,
)
from opstate.reconcile.cloud_gateway import GoogleCloudGateway
from opstate.reconcile.gateway import AuthError
from opstate.store import MemoryStore
from tests.integration.test_google_cloud import JOBS, run, settings, track
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_google_cloud import (
    JWT_BEARER,
    REFUSAL_DESCRIPTION,
    TOKEN_EXCHANGE,
    WIF_AUDIENCE,
    GoogleCloudSide,
    cloud_batch_resource,
    loopback_allowed,
)

EMAIL = "opstate@p1.iam.gserviceaccount.com"
JOB = f"{JOBS}/77"


@pytest.fixture
def cloud(fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch) -> GoogleCloudSide:
    monkeypatch.setenv("GOOGLE_VERTEX_BASE_URL", fake_gemini.base_url)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    for name in ("GOOGLE_API_KEY", "GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION"):
        monkeypatch.delenv(name, raising=False)
    # The Lambda environment: the role's keys, which must never leave but for Google's STS.
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIATESTTESTTESTTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret-key")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "test-session-token")
    return GoogleCloudSide(fake_gemini)


@pytest.fixture
def loopback(fake_gemini: FakeGemini) -> Iterator[None]:
    """The fake's STS admitted (so only the rule under test can stop the request)."""
    with loopback_allowed(fake_gemini):
        yield


def write(tmp_path: Path, info: dict[str, Any], name: str = "creds.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(info))
    return str(path)


def refused_by_gateway(credentials_file: str, **overrides: Any) -> str:
    """The ``AuthError`` a poll through the gateway ends with (its message)."""
    gateway = GoogleCloudGateway(
        settings(google_application_credentials=credentials_file, **overrides)
    )
    try:
        with pytest.raises(AuthError) as info:
            gateway.fetch(track(MemoryStore(), JOB))
    finally:
        gateway.close()
    return info.value.message


def file_source(cloud: GoogleCloudSide, path: str) -> dict[str, Any]:
    info = cloud.external_account_info()
    info["subject_token_type"] = "urn:ietf:params:oauth:token-type:jwt"
    info["credential_source"] = {"file": path}
    return info


# --- a file source: never /proc, never outside the configured folder -------------------------


def test_proc_self_environ_is_neither_read_nor_sent(
    fake_gemini: FakeGemini, cloud: GoogleCloudSide, tmp_path: Path, loopback: None
) -> None:
    """The issue's exploit: a file source on /proc/self/environ, token_url the config's."""
    path = write(tmp_path, file_source(cloud, "/proc/self/environ"))
    message = refused_by_gateway(path)
    assert "is refused: credential_source.file" in message
    assert fake_gemini.requests == [] and cloud.token_requests == []
    # Not with a configured folder either, not even "/".
    message = refused_by_gateway(path, google_subject_token_dir="/")
    assert "is refused: credential_source.file" in message
    assert fake_gemini.requests == []


def test_the_secret_never_names_a_local_file(
    cloud: GoogleCloudSide, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, loopback: None
) -> None:
    import boto3
    from moto import mock_aws

    token = tmp_path / "token"
    token.write_text("a-subject-token")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        sm = boto3.client("secretsmanager", region_name="us-east-1")
        for path in ("/proc/self/environ", str(token)):
            arn = sm.create_secret(
                Name=f"google-{len(path)}", SecretString=json.dumps(file_source(cloud, path))
            )["ARN"]
            s = settings(google_credentials_secret_arn=arn, google_subject_token_dir="/")
            with pytest.raises(CredentialsError, match=r"is refused: credential_source\.file"):
                load_credentials(s)


def test_a_local_file_source_reads_only_inside_its_folder(
    fake_gemini: FakeGemini, cloud: GoogleCloudSide, token_tmp_path: Path, loopback: None
) -> None:
    tmp_path = token_tmp_path
    folder = tmp_path / "tokens"
    folder.mkdir()
    outside = tmp_path / "private.txt"
    outside.write_text("private-marker-1c9e")
    (folder / "link").symlink_to(outside)
    (folder / "oidc.jwt").write_text("header.payload.signature")
    for path in (str(outside), str(folder / "link"), f"{folder}/../private.txt"):
        creds = write(tmp_path, file_source(cloud, path))
        message = refused_by_gateway(creds, google_subject_token_dir=str(folder))
        assert "is refused: credential_source.file" in message, path
    # Without the folder configured, no file source at all.
    creds = write(tmp_path, file_source(cloud, str(folder / "oidc.jwt")))
    assert "credential_source.file" in refused_by_gateway(creds)
    assert fake_gemini.requests == []
    # Inside it, the file's token is what google-auth exchanges (the fake's STS only speaks
    # AWS, so it refuses it: the point is what was sent, and that nothing else was).
    message = refused_by_gateway(creds, google_subject_token_dir=str(folder))
    assert cloud.token_requests == [TOKEN_EXCHANGE]
    assert "header.payload.signature" in str(fake_gemini.requests[0].body)
    assert "private-marker" not in str([r.body for r in fake_gemini.requests])
    assert message == "Google refused the credentials: OAuthError (invalid_grant)"


# --- a url source: refused -------------------------------------------------------------------


def test_a_url_source_fetches_nothing(
    fake_gemini: FakeGemini, cloud: GoogleCloudSide, tmp_path: Path, loopback: None
) -> None:
    info = file_source(cloud, "unused")
    info["credential_source"] = {
        "url": f"{fake_gemini.base_url}/v1/leak",
        "headers": {"Metadata-Flavor": "Google"},
    }
    message = refused_by_gateway(write(tmp_path, info))
    assert "is refused: credential_source.url" in message
    assert fake_gemini.requests == []


# --- an aws source: Google's STS and IAM, AWS's own URLs -----------------------------------


def test_an_aws_exchange_is_sent_to_no_other_token_url(
    fake_gemini: FakeGemini, cloud: GoogleCloudSide, tmp_path: Path
) -> None:
    """The fake's STS without the test switch is any other URL: the signed GetCallerIdentity
    (session token included) must not reach it."""
    message = refused_by_gateway(write(tmp_path, cloud.external_account_info(EMAIL)))
    assert "is refused: token_url must be Google's STS endpoint" in message
    assert fake_gemini.requests == [] and cloud.token_requests == []


def test_aws_metadata_urls_must_be_aws_s(
    fake_gemini: FakeGemini,
    cloud: GoogleCloudSide,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loopback: None,
) -> None:
    # Outside Lambda (no region, no keys in the environment) google-auth asks these URLs.
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(name, raising=False)
    for field, path in (
        ("region_url", "/latest/meta-data/placement/availability-zone"),
        ("url", "/latest/meta-data/iam/security-credentials"),
        ("imdsv2_session_token_url", "/latest/api/token"),
    ):
        info = cloud.external_account_info()
        info["credential_source"][field] = f"{fake_gemini.base_url}{path}"
        message = refused_by_gateway(write(tmp_path, info))
        assert f"is refused: credential_source.{field} must be" in message
    assert fake_gemini.requests == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"service_account_impersonation_url": "https://evil.example/v1/x:generateAccessToken"},
            "service_account_impersonation_url",
        ),
        (
            {
                "credential_source": {
                    "environment_id": "aws1",
                    "regional_cred_verification_url": "https://evil.example/?Action=GetCallerIdentity",
                }
            },
            "credential_source.regional_cred_verification_url",
        ),
        ({"universe_domain": "evil.example"}, "universe_domain"),
        ({"token_info_url": "https://evil.example/introspect"}, "token_info_url"),
    ],
)
def test_other_endpoints_of_an_aws_config_are_refused_when_loaded(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    info = {
        "type": "external_account",
        "audience": WIF_AUDIENCE,
        "subject_token_type": "urn:ietf:params:aws:token-type:aws4_request",
        "token_url": GOOGLE_STS_TOKEN_URL,
        "credential_source": {
            "environment_id": "aws1",
            "regional_cred_verification_url": AWS_VERIFICATION_URL,
        },
        **change,
    }
    with pytest.raises(CredentialsError, match=rf"is refused: {field}") as error:
        load_credentials(settings(google_application_credentials=write(tmp_path, info)))
    assert "evil" not in str(error.value)


def test_the_federation_config_gcloud_writes_loads_from_the_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Google's own endpoints load (constructing sends nothing; the fake-backed exchange is
    test_google_cloud.py's test_workload_identity_federation_from_aws)."""
    import boto3
    from google.auth import aws
    from moto import mock_aws

    info = {
        "universe_domain": "googleapis.com",
        "type": "external_account",
        "audience": WIF_AUDIENCE,
        "subject_token_type": "urn:ietf:params:aws:token-type:aws4_request",
        "token_url": GOOGLE_STS_TOKEN_URL,
        "credential_source": {
            "environment_id": "aws1",
            "region_url": "http://169.254.169.254/latest/meta-data/placement/availability-zone",
            "url": "http://169.254.169.254/latest/meta-data/iam/security-credentials",
            "regional_cred_verification_url": AWS_VERIFICATION_URL,
        },
        "service_account_impersonation_url": f"{IAM_CREDENTIALS_PREFIX}{EMAIL}:generateAccessToken",
    }
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        sm = boto3.client("secretsmanager", region_name="us-east-1")
        arn = sm.create_secret(Name="google-wif", SecretString=json.dumps(info))["ARN"]
        credentials = load_credentials(settings(google_credentials_secret_arn=arn))
    assert isinstance(credentials, aws.Credentials)
    assert credentials.service_account_email == EMAIL
    assert credentials.info["token_url"] == GOOGLE_STS_TOKEN_URL


# --- no remote body in an error ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["service_account", "external_account"])
def test_a_refusing_token_endpoint_s_body_is_in_no_error_and_no_log(
    fake_gemini: FakeGemini,
    cloud: GoogleCloudSide,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    loopback: None,
    kind: str,
) -> None:
    cloud.refuse = True
    info = (
        cloud.service_account_info() if kind == "service_account" else cloud.external_account_info()
    )
    s = settings(google_application_credentials=write(tmp_path, info))
    store = MemoryStore()
    track(store, JOB)
    fake_gemini.put(JOB, cloud_batch_resource(JOB, "SUCCEEDED"))
    # Every level this system logs at (google-auth's own DEBUG request log, off unless its
    # "google" logger is configured, shows bodies: docs/security.md).
    with caplog.at_level(logging.INFO):
        result = run(store, s, GoogleCloudGateway(s))
    assert result.errors >= 1
    assert cloud.token_requests == [JWT_BEARER if kind == "service_account" else TOKEN_EXCHANGE]
    text = "\n".join(r.getMessage() + str(r.__dict__) for r in caplog.records)
    assert "invalid_grant" in text  # the standard error code is kept
    assert "remote-body-marker" not in text and REFUSAL_DESCRIPTION not in text
