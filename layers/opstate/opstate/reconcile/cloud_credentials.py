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

``load_credentials`` raises ``CredentialsError`` with a message that names where it looked and
what was wrong, never the content. google-auth is imported inside functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from opstate.config import Settings

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
    if "file" in source or "url" in source:
        from google.auth import identity_pool

        return identity_pool.Credentials.from_info
    # An "executable" source runs a program named in the JSON: never from a secret.
    raise CredentialsError(f"{where}: external_account credential_source must be aws, file or url")


def credentials_from_info(info: Mapping[str, Any], where: str) -> Any:
    """google-auth credentials (scoped to cloud-platform) of a credentials JSON object."""
    from google.auth import exceptions

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
    if settings.google_credentials_secret_arn:
        where = "the Google credentials secret (OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN)"
        text = _secret_text(settings.google_credentials_secret_arn, settings.secrets_cache_s)
    elif settings.google_application_credentials:
        where = "GOOGLE_APPLICATION_CREDENTIALS"
        text = _file_text(settings.google_application_credentials)
    else:
        raise CredentialsError(
            "no Google Cloud credentials: set OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN (AWS) or "
            "GOOGLE_APPLICATION_CREDENTIALS (a local file)"
        )
    return credentials_from_info(parse_info(text, where), where)


def token_request(timeout_s: float = TOKEN_TIMEOUT_S) -> Any:
    """A google-auth transport request whose calls time out after ``timeout_s``."""
    from google.auth.transport.requests import Request

    class _TimedRequest(Request):
        def __call__(self, url: str, method: str = "GET", *args: Any, **kwargs: Any) -> Any:
            kwargs["timeout"] = min(kwargs.get("timeout") or timeout_s, timeout_s)
            return super().__call__(url, method, *args, **kwargs)  # type: ignore[no-untyped-call]

    return _TimedRequest()
