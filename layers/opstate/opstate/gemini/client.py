"""The Gemini API key and the google-genai client.

- ``api_key``: from Secrets Manager when ``OPSTATE_GEMINI_API_KEY_SECRET_ARN`` is set (the
  secret as text, or a JSON object with the key under one of ``SECRET_JSON_KEYS``), else
  ``GEMINI_API_KEY``; a ``ConfigError`` naming what is missing, never the key.
- ``make_client``: a client with no SDK retries (the reconciler paces itself, the archiver
  retries a failed copy on its next pass), timing out after ``reconcile_http_timeout_s`` or the
  ``timeout_s`` its caller gives (the archiver's per-read ``results_http_timeout_s``).
- ``warm_client``: ``make_client``'s client kept for the next call with the same key, timeout
  and base URL (the reconciler's Lambda container runs every 5 minutes: building a client
  loads the CA bundle twice, about half a warm run's CPU, and opens new connections).

google-genai and Powertools' parameters are imported inside the functions only.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from opstate.config import ConfigError, Settings

if TYPE_CHECKING:
    from google import genai

# Keys tried, in order, when the Gemini API key secret holds a JSON object.
SECRET_JSON_KEYS = ("GEMINI_API_KEY", "api_key", "apiKey", "key")


def _secret_api_key(secret_id: str, max_age_s: int) -> str:
    from aws_lambda_powertools.utilities.parameters import get_secret
    from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

    try:
        value = get_secret(secret_id, max_age=max_age_s)
    except GetParameterError as exc:
        raise ConfigError(f"could not read the Gemini API key secret: {exc}") from None
    text = value.strip() if isinstance(value, str) else ""
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, Mapping):
            for key in SECRET_JSON_KEYS:
                candidate = parsed.get(key)
                if isinstance(candidate, str) and candidate.strip():
                    return candidate.strip()
        raise ConfigError(
            "the Gemini API key secret is JSON without a string under one of "
            + ", ".join(SECRET_JSON_KEYS)
        )
    if not text:
        raise ConfigError("the Gemini API key secret is empty")
    return text


def api_key(settings: Settings) -> str:
    """The Gemini API key: from Secrets Manager if an ARN is set, else ``GEMINI_API_KEY``."""
    if settings.gemini_api_key_secret_arn:
        return _secret_api_key(settings.gemini_api_key_secret_arn, settings.secrets_cache_s)
    if settings.gemini_api_key:
        return settings.gemini_api_key
    raise ConfigError(
        "no Gemini API key: set OPSTATE_GEMINI_API_KEY_SECRET_ARN (Secrets Manager) or "
        "GEMINI_API_KEY"
    )


def make_client(settings: Settings, *, timeout_s: float | None = None) -> genai.Client:
    """A google-genai client for the Gemini API with the configured key.

    The base URL is never passed here, so ``GOOGLE_GEMINI_BASE_URL`` (read by the SDK) points
    it at any server. Requests time out after ``timeout_s`` (default: the reconciler's
    ``reconcile_http_timeout_s``) and are never retried by the SDK (its default would retry a
    429 for up to ~30 s): the run paces itself and leaves the operation for the next run.
    """
    try:
        from google import genai
        from google.genai import types
    except ImportError as exc:  # the CLI installed without its gemini extra
        raise ConfigError(
            f"talking to Gemini needs google-genai ({exc}); install it with "
            "pip install 'gemini-opstate[gemini]'"
        ) from None

    timeout = settings.reconcile_http_timeout_s if timeout_s is None else timeout_s
    options = types.HttpOptions(
        timeout=max(1, int(timeout * 1000)),
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    return genai.Client(vertexai=False, api_key=api_key(settings), http_options=options)


_warm_lock = threading.Lock()
_warm: dict[tuple[str, float, str], genai.Client] = {}


def warm_client(settings: Settings) -> genai.Client:
    """``make_client(settings)``, kept for the next call while the key (Secrets Manager read
    as ``api_key`` reads it: a rotated key makes a new client), the timeout and
    ``GOOGLE_GEMINI_BASE_URL`` stay the same; the one it replaces is closed. The caller
    must not close it."""
    key = (api_key(settings), settings.reconcile_http_timeout_s, _base_url())
    with _warm_lock:
        client = _warm.get(key)
        if client is None:
            client = make_client(settings)
            for old in _warm.values():
                old.close()
            _warm.clear()
            _warm[key] = client
        return client


def _base_url() -> str:
    return os.environ.get("GOOGLE_GEMINI_BASE_URL", "")
