"""Google Cloud credentials for the reconciler, through google-auth (never logged).

Where they come from, in order:

1. ``OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN``: a Secrets Manager secret holding a google-auth
   credentials JSON. The recommended one is an ``external_account`` file with the ``aws``
   credential source (workload identity federation: google-auth signs an STS
   ``GetCallerIdentity`` request with the Lambda role's own credentials and exchanges it at
   Google's STS, so no long-lived Google key exists anywhere); a ``service_account`` key is
   the fallback.
2. ``GOOGLE_APPLICATION_CREDENTIALS``: the same JSON in a file (google-auth's standard
   variable), for local runs.

Before any google-auth class sees the JSON, ``cloud_credentials_policy.refusal`` checks it:
only Google's and AWS's endpoints, an ``aws`` source (a ``file`` source only locally, inside
``OPSTATE_GOOGLE_SUBJECT_TOKEN_DIR``), or a ``service_account`` key (docs/security.md).

``load_credentials`` raises ``CredentialsError`` with a message that names where it looked and
what was wrong, never the content; ``auth_error_reason`` says why a token request failed without
a word of the answer's body. google-auth is imported inside functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from opstate.config import Settings
from opstate.reconcile.cloud_credentials_policy import (
    loopback_base,
    refusal,
    resolved_file_refusal,
)

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# The credential types google-auth loads from a JSON and this system accepts.
CREDENTIAL_TYPES = ("external_account", "service_account")
# Seconds one token request (to Google's OAuth endpoint or STS) may take.
TOKEN_TIMEOUT_S = 10.0


class CredentialsError(Exception):
    """No usable Google Cloud credentials (missing, empty, malformed); the message is safe to
    log (it never holds the secret)."""


def _secret_text(secret_id: str, max_age_s: int) -> str:
    from aws_lambda_powertools.utilities.parameters import get_secret
    from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

    try:
        value = get_secret(secret_id, max_age=max_age_s)
    except GetParameterError as exc:
        raise CredentialsError(
            "could not read the Google credentials secret (a secret the template created has "
            "no value until you put-secret-value the credentials JSON; docs/google-cloud.md): "
            f"{type(exc).__name__}"
        ) from None
    return value if isinstance(value, str) else ""


def _file_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialsError(
            f"could not read GOOGLE_APPLICATION_CREDENTIALS ({path}): {type(exc).__name__}"
        ) from None


def parse_info(text: str, where: str) -> dict[str, Any]:
    """The credentials JSON object of ``text``; ``CredentialsError`` when it is none."""
    if not text.strip():
        raise CredentialsError(
            f"{where} is empty: put a google-auth credentials JSON in it (docs/google-cloud.md)"
        )
    try:
        info = json.loads(text)
    except ValueError:
        raise CredentialsError(f"{where} is not JSON") from None
    if not isinstance(info, Mapping):
        raise CredentialsError(f"{where} is not a JSON object")
    kind = info.get("type")
    if kind not in CREDENTIAL_TYPES:
        raise CredentialsError(
            f"{where} has type {kind!r}; expected one of {', '.join(CREDENTIAL_TYPES)}"
        )
    return dict(info)


def _loader(info: Mapping[str, Any], where: str) -> Any:
    """The google-auth constructor for this credential type (a type-specific one, as
    google-auth recommends for configurations that come from outside)."""
    if info.get("type") == "service_account":
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_info
    source = info.get("credential_source")
    if not isinstance(source, Mapping):
        raise CredentialsError(f"{where}: an external_account needs a credential_source object")
    environment = source.get("environment_id")
    if isinstance(environment, str) and environment.startswith("aws"):
        from google.auth import aws

        return aws.Credentials.from_info
    if "file" in source:
        from google.auth import identity_pool

        return identity_pool.Credentials.from_info
    # Unreachable after refusal(); kept so this never hands google-auth another source.
    raise CredentialsError(f"{where}: external_account credential_source must be aws or file")


def credentials_from_info(
    info: Mapping[str, Any], where: str, *, local_token_dir: str | None = None
) -> Any:
    """google-auth credentials (scoped to cloud-platform) of a credentials JSON object, once
    ``cloud_credentials_policy`` accepts it (``local_token_dir``: where a local ``file`` source
    may read; ``None`` refuses every file source)."""
    from google.auth import exceptions

    problem = refusal(info, local_token_dir=local_token_dir, loopback=loopback_base())
    problem = problem or resolved_file_refusal(info, local_token_dir)
    if problem:
        raise CredentialsError(f"{where} is refused: {problem}")
    load = _loader(info, where)
    try:
        return load(dict(info), scopes=[CLOUD_PLATFORM_SCOPE])
    except (exceptions.GoogleAuthError, ValueError, KeyError, TypeError) as exc:
        # google-auth's messages name fields, never values; keep only the first line.
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if "PRIVATE KEY" in reason:
            reason = type(exc).__name__
        raise CredentialsError(f"{where} is not usable credentials: {reason}") from None


def load_credentials(settings: Settings) -> Any:
    """The reconciler's Google Cloud credentials (see the module docstring)."""
    token_dir: str | None = None  # the secret never names a local file
    if settings.google_credentials_secret_arn:
        where = "the Google credentials secret (OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN)"
        text = _secret_text(settings.google_credentials_secret_arn, settings.secrets_cache_s)
    elif settings.google_application_credentials:
        where = "GOOGLE_APPLICATION_CREDENTIALS"
        text = _file_text(settings.google_application_credentials)
        token_dir = settings.google_subject_token_dir
    else:
        raise CredentialsError(
            "no Google Cloud credentials: set OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN (AWS) or "
            "GOOGLE_APPLICATION_CREDENTIALS (a local file)"
        )
    return credentials_from_info(parse_info(text, where), where, local_token_dir=token_dir)


# OAuth 2.0 (RFC 6749 5.2) and token exchange (RFC 8693) error codes: the only words of a
# token endpoint's answer an error message may carry.
OAUTH_ERROR_CODES = frozenset(
    (
        "invalid_request",
        "invalid_client",
        "invalid_grant",
        "unauthorized_client",
        "unsupported_grant_type",
        "invalid_scope",
        "invalid_target",
        "access_denied",
        "server_error",
        "temporarily_unavailable",
    )
)


def auth_error_reason(exc: BaseException) -> str:
    """Why a google-auth token request failed, safe to log: the exception's type and, when the
    answer was an OAuth error, its standard code; never the body (a token or metadata endpoint's
    answer is not ours to echo, and google-auth puts it in its messages)."""
    for arg in getattr(exc, "args", ()):
        code = _oauth_error_code(arg)
        if code is not None:
            return f"{type(exc).__name__} ({code})"
    return type(exc).__name__


def _oauth_error_code(value: Any) -> str | None:
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, Mapping):
        code = value.get("error")
        if isinstance(code, str) and code in OAUTH_ERROR_CODES:
            return code
    return None


def token_request(timeout_s: float = TOKEN_TIMEOUT_S) -> Any:
    """A google-auth transport request whose calls time out after ``timeout_s``."""
    from google.auth.transport.requests import Request

    class _TimedRequest(Request):
        def __call__(self, url: str, method: str = "GET", *args: Any, **kwargs: Any) -> Any:
            kwargs["timeout"] = min(kwargs.get("timeout") or timeout_s, timeout_s)
            return super().__call__(url, method, *args, **kwargs)  # type: ignore[no-untyped-call]

    return _TimedRequest()
