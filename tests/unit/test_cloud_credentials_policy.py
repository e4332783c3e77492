"""``cloud_credentials_policy.refusal``: what a Google credentials JSON may say (pure), and the
loopback switch only tests can turn on."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from opstate.reconcile import cloud_credentials_policy as policy
from opstate.reconcile.cloud_credentials_policy import (
    AWS_VERIFICATION_URL,
    GOOGLE_STS_TOKEN_URL,
    IAM_CREDENTIALS_PREFIX,
    allow_loopback_for_tests,
    refusal,
)

ROOT = Path(__file__).resolve().parents[2]
AUDIENCE = (
    "//iam.googleapis.com/projects/123456/locations/global/workloadIdentityPools/opstate-pool"
    "/providers/opstate-aws"
)
EMAIL = "opstate-reader@p1.iam.gserviceaccount.com"
FAKE = "http://127.0.0.1:8123"


def gcloud_aws(**extra: Any) -> dict[str, Any]:
    """What `gcloud iam workload-identity-pools create-cred-config --aws --service-account=...`
    writes (docs/google-cloud.md, step 4)."""
    info: dict[str, Any] = {
        "universe_domain": "googleapis.com",
        "type": "external_account",
        "audience": AUDIENCE,
        "subject_token_type": "urn:ietf:params:aws:token-type:aws4_request",
        "token_url": GOOGLE_STS_TOKEN_URL,
        "credential_source": {
            "environment_id": "aws1",
            "region_url": "http://169.254.169.254/latest/meta-data/placement/availability-zone",
            "url": "http://169.254.169.254/latest/meta-data/iam/security-credentials",
            "regional_cred_verification_url": AWS_VERIFICATION_URL,
        },
        "service_account_impersonation_url": (
            f"{IAM_CREDENTIALS_PREFIX}{EMAIL}:generateAccessToken"
        ),
    }
    info.update(extra)
    return info


def file_config(path: str) -> dict[str, Any]:
    return {
        "type": "external_account",
        "audience": AUDIENCE,
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": GOOGLE_STS_TOKEN_URL,
        "credential_source": {"file": path, "format": {"type": "text"}},
    }


def with_source(**changes: Any) -> dict[str, Any]:
    info = gcloud_aws()
    for key, value in changes.items():
        if value is None:
            info["credential_source"].pop(key, None)
        else:
            info["credential_source"][key] = value
    return info


def test_what_gcloud_writes_for_aws_federation_is_accepted() -> None:
    assert refusal(gcloud_aws()) is None
    imdsv2 = with_source(imdsv2_session_token_url="http://169.254.169.254/latest/api/token")
    assert refusal(imdsv2) is None
    ipv6 = with_source(url="http://[fd00:ec2::254]/latest/meta-data/iam/security-credentials")
    assert refusal(ipv6) is None
    # The Lambda environment's own credentials and region: no metadata URL at all.
    assert refusal(with_source(region_url=None, url=None)) is None
    bare = gcloud_aws()
    for optional in ("universe_domain", "service_account_impersonation_url"):
        del bare[optional]
    assert refusal(bare) is None
    assert (
        refusal(gcloud_aws(service_account_impersonation={"token_lifetime_seconds": 600})) is None
    )
    assert refusal(gcloud_aws(token_info_url="https://sts.googleapis.com/v1/introspect")) is None
    assert refusal(gcloud_aws(quota_project_id="my-project")) is None


def test_a_service_account_key_is_left_to_google_auth_as_before() -> None:
    assert refusal({"type": "service_account", "token_uri": "https://example.com/t"}) is None


REFUSED: list[tuple[dict[str, Any], str]] = [
    # Where the token exchange (AWS keys and session token signed into it) is POSTed.
    (gcloud_aws(token_url="https://evil.example/v1/token"), "token_url"),
    (gcloud_aws(token_url="https://sts.googleapis.com.evil.example/v1/token"), "token_url"),
    (gcloud_aws(token_url=f"{FAKE}/v1/token"), "token_url"),  # the fake, switch off
    ({k: v for k, v in gcloud_aws().items() if k != "token_url"}, "token_url"),
    (
        gcloud_aws(
            service_account_impersonation_url=(
                f"https://evil.example/v1/projects/-/serviceAccounts/{EMAIL}:generateAccessToken"
            )
        ),
        "service_account_impersonation_url",
    ),
    (
        gcloud_aws(
            service_account_impersonation_url=(
                f"https://iamcredentials.googleapis.com@evil.example/v1/projects/-/"
                f"serviceAccounts/{EMAIL}:generateAccessToken"
            )
        ),
        "service_account_impersonation_url",
    ),
    (
        gcloud_aws(
            service_account_impersonation_url=(
                f"{IAM_CREDENTIALS_PREFIX}{EMAIL}:generateAccessToken?next=https://evil.example"
            )
        ),
        "service_account_impersonation_url",
    ),
    (gcloud_aws(token_info_url="https://evil.example/introspect"), "token_info_url"),
    (gcloud_aws(universe_domain="evil.example"), "universe_domain"),
    (gcloud_aws(audience="//iam.googleapis.com/locations/global/workforcePools/p"), "audience"),
    (gcloud_aws(subject_token_type="urn:ietf:params:oauth:token-type:jwt"), "subject_token_type"),
    (gcloud_aws(client_id="x", client_secret="y"), "client_id"),
    (gcloud_aws(workforce_pool_user_project="1"), "workforce_pool_user_project"),
    (gcloud_aws(aws_security_credentials_supplier="x"), "aws_security_credentials_supplier"),
    (gcloud_aws(service_account_impersonation={"url": "x"}), "service_account_impersonation"),
    (gcloud_aws(quota_project_id="p\r\nX-Evil: 1"), "quota_project_id"),
    # The aws source's own URLs: AWS's, or none.
    (with_source(region_url="https://evil.example/az"), "credential_source.region_url"),
    (with_source(url="http://169.254.169.254.evil.example/creds"), "credential_source.url"),
    (
        with_source(imdsv2_session_token_url="http://127.0.0.1:9/latest/api/token"),
        "credential_source.imdsv2_session_token_url",
    ),
    (
        with_source(
            regional_cred_verification_url="https://evil.example/?Action=GetCallerIdentity"
        ),
        "credential_source.regional_cred_verification_url",
    ),
    (with_source(environment_id="aws2"), "credential_source.environment_id"),
    (with_source(headers={"X": "y"}), "credential_source.headers"),
    (with_source(url=None, file="/proc/self/environ"), "credential_source.file"),
    # Other sources.
    (
        gcloud_aws(credential_source={"url": "https://evil.example/token", "headers": {"a": "b"}}),
        "credential_source.url",
    ),
    (
        gcloud_aws(credential_source={"executable": {"command": "id"}}),
        "credential_source.executable",
    ),
    (gcloud_aws(credential_source={"certificate": {}}), "credential_source.certificate"),
    (gcloud_aws(credential_source={}), "credential_source"),
    (gcloud_aws(credential_source="aws1"), "credential_source"),
    # A file source from the secret (no local folder): never, /proc least of all.
    (file_config("/proc/self/environ"), "credential_source.file"),
    (file_config("/tmp/token"), "credential_source.file"),
]


@pytest.mark.parametrize(("info", "field"), REFUSED, ids=[f for _, f in REFUSED])
def test_everything_else_is_refused_in_one_sentence_naming_the_field(
    info: dict[str, Any], field: str
) -> None:
    before = copy.deepcopy(info)
    reason = refusal(info)
    assert reason is not None and reason.startswith(field), reason
    assert "\n" not in reason and "evil" not in reason and "\r" not in reason
    assert info == before  # pure: nothing changed


def test_an_unusual_field_name_is_not_echoed() -> None:
    reason = refusal(gcloud_aws(**{"secret\nvalue": 1}))
    assert reason is not None and "secret" not in reason and "\n" not in reason


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/srv/tokens/oidc.jwt", True),
        ("/srv/tokens/sub/oidc.jwt", True),
        ("/srv/tokens", False),
        ("/srv/tokens/../secrets/x", False),
        ("/srv/tokens-other/x", False),
        ("/srv/other/x", False),
        ("tokens/x", False),
        ("/proc/self/environ", False),
    ],
)
def test_a_local_file_source_reads_only_inside_the_configured_folder(path: str, ok: bool) -> None:
    reason = refusal(file_config(path), local_token_dir="/srv/tokens")
    assert (reason is None) is ok, reason
    if not ok:
        assert reason is not None and reason.startswith("credential_source.file")


@pytest.mark.parametrize("folder", ["/", "/proc", "/proc/self", "/dev", "relative"])
def test_no_configured_folder_opens_proc(folder: str) -> None:
    for path in ("/proc/self/environ", "/proc/1/environ", "/dev/stdin", "/sys/x"):
        assert refusal(file_config(path), local_token_dir=folder) is not None


def test_a_symlink_out_of_the_folder_is_refused_once_resolved(token_tmp_path: Path) -> None:
    tmp_path = token_tmp_path
    folder = tmp_path / "tokens"
    folder.mkdir()
    (folder / "token").write_text("t")
    (folder / "link").symlink_to("/proc/self/environ")
    (folder / "up").symlink_to(tmp_path)
    for name, ok in (("token", True), ("link", False), ("up/tokens/token", True)):
        info = file_config(str(folder / name))
        assert refusal(info, local_token_dir=str(folder)) is None
        resolved = policy.resolved_file_refusal(info, str(folder))
        assert (resolved is None) is ok, name


def test_the_loopback_switch_admits_only_the_fake_and_only_when_on() -> None:
    fake = gcloud_aws(
        token_url=f"{FAKE}/v1/token",
        service_account_impersonation_url=(
            f"{FAKE}/v1/projects/-/serviceAccounts/{EMAIL}:generateAccessToken"
        ),
    )
    assert refusal(fake) is not None
    assert refusal(fake, loopback=FAKE) is None
    # The switch never opens anything else, and its setter takes loopback only.
    assert refusal(gcloud_aws(token_url="http://127.0.0.1:9/v1/token"), loopback=FAKE)
    for bad in ("https://evil.example", "http://localhost:1", "http://127.0.0.1:1/x", ""):
        with pytest.raises(ValueError):
            allow_loopback_for_tests(bad)
    assert policy.loopback_base() is None


def test_nothing_in_the_package_can_turn_the_switch_on() -> None:
    """The switch is module state set by test code: no setting, variable or secret field."""
    package = ROOT / "layers" / "opstate" / "opstate"
    callers = [
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if "allow_loopback_for_tests(" in path.read_text(encoding="utf-8")
    ]
    assert callers == ["reconcile/cloud_credentials_policy.py"]
    source = (package / "reconcile" / "cloud_credentials_policy.py").read_text(encoding="utf-8")
    assert not re.search(r"os\.environ|getenv|open\(", source)
    assert source.count("global _loopback_base") == 1  # only the setter writes it
