"""The local server's API token: who may use the operations routes of ``opstate serve``.

``opstate serve`` requires ``Authorization: Bearer <token>`` on ``GET`` / ``PUT
/operations/...`` (and on anything else that shows or changes records). The token is
``OPSTATE_API_TOKEN`` when set, otherwise generated on first start into a file beside the
webhook secret file (``.opstate/api-token``, mode 0600) and read from there by later starts
(and by anything else that needs it: ``opstate.local.secret_file.api_token_for``). The webhook
route never needs it: Gemini's deliveries are authenticated by their
signature.

``bearer_token_ok`` is the one check: constant-time, and it refuses an empty expected token.
"""

from __future__ import annotations

import hmac
import secrets as secrets_module
from dataclasses import dataclass
from pathlib import Path

from opstate.config import MIN_API_TOKEN_LENGTH
from opstate.private_files import read_private_file
from opstate.webhook_secrets import create_private_file

API_TOKEN_ENV = "OPSTATE_API_TOKEN"
API_TOKEN_FILE_NAME = "api-token"
TOKEN_BYTES = 32
_BEARER = "bearer "


def bearer_token_ok(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>`` (scheme in any case).

    The comparison runs in constant time over the UTF-8 bytes; an empty ``token`` never matches.
    """
    if not token or not authorization:
        return False
    value = authorization.strip()
    if value[: len(_BEARER)].lower() != _BEARER:
        return False
    presented = value[len(_BEARER) :].strip()
    return hmac.compare_digest(
        presented.encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass")
    )


def generate_api_token() -> str:
    return secrets_module.token_urlsafe(TOKEN_BYTES)


def token_file_beside(secret_file: Path) -> Path:
    """Where the generated token lives: beside the webhook secret file."""
    return secret_file.with_name(API_TOKEN_FILE_NAME)


TOKEN_FILE_WHAT = "the API token file"


def read_token_file(path: Path) -> str:
    """The token stored in ``path``: ``OSError`` if unreadable; ``ValueError`` (one sentence
    naming the file and the fix) if others could read, change or swap it
    (``opstate.private_files``) or if it does not hold one token of at least the length
    ``OPSTATE_API_TOKEN`` must have."""
    try:
        token = read_private_file(path, TOKEN_FILE_WHAT).decode("utf-8").strip()
    except UnicodeDecodeError:
        token = ""
    if not token or any(c.isspace() for c in token) or len(token) < MIN_API_TOKEN_LENGTH:
        raise ValueError(
            f"{TOKEN_FILE_WHAT} {path} does not hold one token of at least "
            f"{MIN_API_TOKEN_LENGTH} characters without spaces (as OPSTATE_API_TOKEN must); "
            "delete it to have a new one generated"
        )
    return token


@dataclass(frozen=True, slots=True)
class ApiToken:
    token: str
    origin: str  # "env" or "file"
    path: Path | None
    generated: bool


def resolve_api_token(env_token: str | None, token_file: Path) -> ApiToken:
    """``env_token`` (``OPSTATE_API_TOKEN``) if set; else ``token_file``, generated (0600) on
    first use. Two processes starting at once agree on one token (exclusive create)."""
    if env_token:
        return ApiToken(env_token, "env", None, False)
    path = token_file
    generated = False
    if not path.exists():
        generated = create_private_file(path, generate_api_token() + "\n")
    return ApiToken(read_token_file(path), "file", path, generated)
