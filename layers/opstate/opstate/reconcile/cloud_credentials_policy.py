"""What a Google credentials JSON may say, checked before google-auth sees it.

google-auth's ``external_account`` classes do not check their configuration (their docstrings
say so): they POST to ``token_url`` and ``service_account_impersonation_url``, an ``aws`` source
GETs its ``region_url`` / ``url`` / ``imdsv2_session_token_url`` (when the environment has no
AWS credentials) and signs ``regional_cred_verification_url``, a ``url`` source GETs any URL
with any headers, and a ``file`` source reads any path, on every refresh. The credentials secret
is documented as holding "no secret", so it must not be a way to send the reconciler's own
credentials (its environment holds the role's AWS keys) anywhere. Accepted, nothing else:

- ``service_account``: as before (google-auth's own checks; the key signs what it sends).
- ``external_account`` with an ``aws`` source (workload identity federation from the Lambda
  role): ``token_url`` exactly ``GOOGLE_STS_TOKEN_URL``; ``service_account_impersonation_url``
  absent or ``IAM_CREDENTIALS_PREFIX`` + an email + ``:generateAccessToken``; ``audience`` a
  workload identity pool provider; ``subject_token_type`` AWS's;
  ``regional_cred_verification_url`` exactly ``AWS_VERIFICATION_URL``; each EC2 metadata URL
  absent (the Lambda environment's own credentials and region) or exactly AWS's
  (``AWS_METADATA_URLS``); optional ``token_info_url`` (Google's), ``universe_domain``
  (``googleapis.com``), ``quota_project_id``, ``service_account_impersonation``
  (``token_lifetime_seconds``). Any other field is refused.
- ``external_account`` with a ``file`` source: only from ``GOOGLE_APPLICATION_CREDENTIALS``
  (a local run) when ``OPSTATE_GOOGLE_SUBJECT_TOKEN_DIR`` names a folder, for an absolute,
  normalised path inside it, never under ``/proc``, ``/sys`` or ``/dev`` (``refusal``), checked
  again with symlinks resolved (``resolved_file_refusal``); the same URL rules.
- A ``url``, ``executable`` or ``certificate`` source: refused.

``refusal`` is pure: the parsed JSON in, ``None`` or one sentence naming the field (never its
value) out. ``cloud_credentials`` calls it before any google-auth class, request or file read.

Tests only: ``allow_loopback_for_tests(base_url)`` also admits the fake's STS and impersonation
endpoints at ``http://127.0.0.1:PORT``. It is module state, set by Python code running in the
process (a test, or the sitecustomize an e2e test writes); no setting, environment variable or
field of the secret reaches it, and nothing in this package calls it.
"""

from __future__ import annotations

import os.path
import re
from collections.abc import Mapping
from typing import Any

GOOGLE_STS_TOKEN_URL = "https://sts.googleapis.com/v1/token"
GOOGLE_STS_INTROSPECT_URL = "https://sts.googleapis.com/v1/introspect"
IAM_CREDENTIALS_PREFIX = "https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/"
GOOGLE_UNIVERSE_DOMAIN = "googleapis.com"
AWS_VERIFICATION_URL = (
    "https://sts.{region}.amazonaws.com?Action=GetCallerIdentity&Version=2011-06-15"
)
AWS_SUBJECT_TOKEN_TYPE = "urn:ietf:params:aws:token-type:aws4_request"
FILE_SUBJECT_TOKEN_TYPES = (
    "urn:ietf:params:oauth:token-type:jwt",
    "urn:ietf:params:oauth:token-type:id_token",
    "urn:ietf:params:oauth:token-type:saml2",
)
# The EC2 instance metadata service (IPv4 and IPv6), the only place an aws source may ask.
_IMDS_HOSTS = ("http://169.254.169.254", "http://[fd00:ec2::254]")
AWS_METADATA_URLS: Mapping[str, tuple[str, ...]] = {
    field: tuple(host + path for host in _IMDS_HOSTS)
    for field, path in (
        ("region_url", "/latest/meta-data/placement/availability-zone"),
        ("url", "/latest/meta-data/iam/security-credentials"),
        ("imdsv2_session_token_url", "/latest/api/token"),
    )
}
# Never a subject token, whatever folder is configured.
FORBIDDEN_ROOTS = ("/proc", "/sys", "/dev")

_AUDIENCE = re.compile(
    r"//iam\.googleapis\.com/projects/[^/\s]+/locations/global"
    r"/workloadIdentityPools/[^/\s]+/providers/[^/\s]+"
)
_EMAIL = r"[^/?#:@\s]+@[^/?#:@\s]+"
_QUOTA_PROJECT = re.compile(r"[A-Za-z0-9._:-]{1,100}")
_FIELD_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
_LOOPBACK = re.compile(r"http://127\.0\.0\.1:[0-9]{1,5}")
_OPTIONAL = (
    "service_account_impersonation_url",
    "service_account_impersonation",
    "token_info_url",
    "universe_domain",
    "quota_project_id",
)
_EXTERNAL_FIELDS = frozenset(
    ("type", "audience", "subject_token_type", "token_url", "credential_source", *_OPTIONAL)
)
_SOURCE_KINDS = ("environment_id", "file", "url", "executable", "certificate")

_loopback_base: str | None = None


def allow_loopback_for_tests(base_url: str | None) -> None:
    """TESTS ONLY: also accept ``token_url`` ``{base_url}/v1/token`` and impersonation URLs
    under ``{base_url}/v1/projects/-/serviceAccounts/``, where ``base_url`` is a fake's
    ``http://127.0.0.1:PORT``; ``None`` turns it off. Any other address is a ``ValueError``."""
    global _loopback_base
    if base_url is not None and not _LOOPBACK.fullmatch(base_url):
        raise ValueError("allow_loopback_for_tests takes only http://127.0.0.1:PORT")
    _loopback_base = base_url


def loopback_base() -> str | None:
    """What ``allow_loopback_for_tests`` set (``None`` in production)."""
    return _loopback_base


def refusal(
    info: Mapping[str, Any],
    *,
    local_token_dir: str | None = None,
    loopback: str | None = None,
) -> str | None:
    """``None`` when ``info`` is acceptable, else one sentence naming the refused field.

    ``local_token_dir``: the folder a ``file`` source may read (``None``: no file source, as
    for the secret). ``loopback``: ``allow_loopback_for_tests``'s base URL (``None``: Google's
    endpoints only)."""
    if info.get("type") != "external_account":
        return None  # service_account: google-auth's own checks, as before
    unknown = sorted(str(key) for key in info if key not in _EXTERNAL_FIELDS)
    if unknown:
        return f"{_name(unknown[0])} is not a field an external_account may have here"
    source = info.get("credential_source")
    if not isinstance(source, Mapping):
        return "credential_source must be an object"
    kinds = [kind for kind in _SOURCE_KINDS if kind in source]
    if kinds[:1] == ["environment_id"]:
        problem = _aws_source(source)
        token_types: tuple[str, ...] = (AWS_SUBJECT_TOKEN_TYPE,)
    elif kinds[:1] == ["file"]:
        problem = _file_source(source, local_token_dir)
        token_types = FILE_SUBJECT_TOKEN_TYPES
    else:
        name = f"credential_source.{kinds[0]}" if kinds else "credential_source"
        return f"{name} is not accepted: only an aws source (or, locally, a file) is"
    return problem or _common(info, token_types, loopback)


def _common(
    info: Mapping[str, Any], token_types: tuple[str, ...], loopback: str | None
) -> str | None:
    return _endpoints(info, loopback) or _identity(info, token_types) or _options(info)


def _endpoints(info: Mapping[str, Any], loopback: str | None) -> str | None:
    """The URLs google-auth POSTs to: Google's own (or the tests' loopback fake)."""
    token_urls = {GOOGLE_STS_TOKEN_URL}
    prefixes = [IAM_CREDENTIALS_PREFIX]
    if loopback is not None:
        token_urls.add(f"{loopback}/v1/token")
        prefixes.append(f"{loopback}/v1/projects/-/serviceAccounts/")
    if info.get("token_url") not in token_urls:
        return f"token_url must be Google's STS endpoint {GOOGLE_STS_TOKEN_URL}"
    impersonation = info.get("service_account_impersonation_url")
    if impersonation is not None and not _impersonation_ok(impersonation, prefixes):
        return (
            "service_account_impersonation_url must be "
            f"{IAM_CREDENTIALS_PREFIX}EMAIL:generateAccessToken"
        )
    if info.get("token_info_url", GOOGLE_STS_INTROSPECT_URL) != GOOGLE_STS_INTROSPECT_URL:
        return f"token_info_url must be {GOOGLE_STS_INTROSPECT_URL} when given"
    if info.get("universe_domain", GOOGLE_UNIVERSE_DOMAIN) != GOOGLE_UNIVERSE_DOMAIN:
        return f"universe_domain must be {GOOGLE_UNIVERSE_DOMAIN} when given"
    return None


def _identity(info: Mapping[str, Any], token_types: tuple[str, ...]) -> str | None:
    audience = info.get("audience")
    if not isinstance(audience, str) or not _AUDIENCE.fullmatch(audience):
        return "audience must name a workload identity pool provider"
    if info.get("subject_token_type") not in token_types:
        return f"subject_token_type must be {' or '.join(token_types)}"
    return None


def _options(info: Mapping[str, Any]) -> str | None:
    quota = info.get("quota_project_id")
    if quota is not None and not (isinstance(quota, str) and _QUOTA_PROJECT.fullmatch(quota)):
        return "quota_project_id must be a project id"
    options = info.get("service_account_impersonation")
    if options is not None and not _impersonation_options_ok(options):
        return "service_account_impersonation may hold only token_lifetime_seconds (a number)"
    return None


def _impersonation_ok(url: Any, prefixes: list[str]) -> bool:
    return isinstance(url, str) and any(
        re.fullmatch(re.escape(prefix) + _EMAIL + ":generateAccessToken", url)
        for prefix in prefixes
    )


def _impersonation_options_ok(options: Any) -> bool:
    if not isinstance(options, Mapping) or set(options) - {"token_lifetime_seconds"}:
        return False
    lifetime = options.get("token_lifetime_seconds", 3600)
    return isinstance(lifetime, int) and not isinstance(lifetime, bool) and lifetime > 0


def _aws_source(source: Mapping[str, Any]) -> str | None:
    allowed = {"environment_id", "regional_cred_verification_url", *AWS_METADATA_URLS}
    unknown = sorted(str(key) for key in source if key not in allowed)
    if unknown:
        return f"credential_source.{_name(unknown[0])} is not accepted in an aws source"
    if source.get("environment_id") != "aws1":
        return "credential_source.environment_id must be aws1"
    if source.get("regional_cred_verification_url") != AWS_VERIFICATION_URL:
        return f"credential_source.regional_cred_verification_url must be {AWS_VERIFICATION_URL}"
    for field, urls in AWS_METADATA_URLS.items():
        if field in source and source[field] not in urls:
            return (
                f"credential_source.{field} must be the EC2 metadata service's ({urls[0]}) "
                "or absent (the Lambda environment's own credentials)"
            )
    return None


def _file_source(source: Mapping[str, Any], token_dir: str | None) -> str | None:
    unknown = sorted(str(key) for key in source if key not in ("file", "format"))
    if unknown:
        return f"credential_source.{_name(unknown[0])} is not accepted in a file source"
    fmt = source.get("format", {"type": "text"})
    if not (
        isinstance(fmt, Mapping)
        and (
            dict(fmt) == {"type": "text"}
            or (
                set(fmt) == {"type", "subject_token_field_name"}
                and fmt["type"] == "json"
                and isinstance(fmt["subject_token_field_name"], str)
            )
        )
    ):
        return "credential_source.format must be text, or json with a subject_token_field_name"
    if token_dir is None:
        return (
            "credential_source.file is accepted only in a local GOOGLE_APPLICATION_CREDENTIALS "
            "file with OPSTATE_GOOGLE_SUBJECT_TOKEN_DIR set"
        )
    if not os.path.isabs(token_dir) or _forbidden(os.path.normpath(token_dir)):
        return "OPSTATE_GOOGLE_SUBJECT_TOKEN_DIR must be absolute and outside /proc, /sys, /dev"
    return _path_problem(source.get("file"), os.path.normpath(token_dir))


def _path_problem(path: Any, folder: str) -> str | None:
    if not isinstance(path, str) or not os.path.isabs(path) or os.path.normpath(path) != path:
        return "credential_source.file must be an absolute, normalised path"
    if _forbidden(path) or not _inside(path, folder):
        return "credential_source.file must be inside OPSTATE_GOOGLE_SUBJECT_TOKEN_DIR"
    return None


def resolved_file_refusal(info: Mapping[str, Any], token_dir: str | None) -> str | None:
    """``refusal``'s file rule again with symlinks resolved (``os.path.realpath``: no file is
    opened). Call it after ``refusal`` returned ``None``."""
    source = info.get("credential_source")
    if token_dir is None or not isinstance(source, Mapping) or "file" not in source:
        return None
    return _path_problem(os.path.realpath(str(source["file"])), os.path.realpath(token_dir))


def _inside(path: str, folder: str) -> bool:
    return path != folder and os.path.commonpath([path, folder]) == folder


def _forbidden(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in FORBIDDEN_ROOTS)


def _name(key: str) -> str:
    """A field's name as a message may show it (the secret's keys are its content too)."""
    return key if _FIELD_NAME.fullmatch(key) else "<a name with unusual characters>"
