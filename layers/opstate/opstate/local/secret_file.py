"""The local webhook secret and API token of ``opstate serve``: where they come from.

The secret file (``.opstate/webhook-secret``) is read, generated and written by
``opstate.webhook_secrets`` (one rule for every reader: only ``whsec_`` keys of at least 24
bytes count, ``#`` lines are comments). The API token that guards the operations routes lives
beside it (``.opstate/api-token``, ``opstate.api_token``) unless ``OPSTATE_API_TOKEN`` is set.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from opstate.api_token import ApiToken, resolve_api_token, token_file_beside
from opstate.config import Settings, checked_api_token
from opstate.webhook_secrets import (
    KEY_RULE,
    SecretFileReader,
    create_secret_file,
    generate_secret,
    parse_stored,
    read_secret_file,
    write_secret_file,
)

DEFAULT_SECRET_FILE = Path(".opstate") / "webhook-secret"

__all__ = [
    "DEFAULT_SECRET_FILE",
    "SecretFileReader",
    "SecretSource",
    "api_token_for",
    "generate_secret",
    "resolve_secrets",
    "write_secret_file",
]


@dataclasses.dataclass(frozen=True)
class SecretSource:
    """Where the webhook secrets come from, for the start-up banner."""

    secrets: tuple[str, ...]  # the usable keys, newest first
    origin: str  # "env" or "file"
    path: Path | None
    generated: bool
    warnings: tuple[str, ...] = ()  # one per ignored entry: its position, never its value


def resolve_secrets(settings: Settings, secret_file: Path) -> SecretSource:
    """``OPSTATE_WEBHOOK_SECRETS`` if set; else the secret file, generated once if missing.

    ``ValueError`` when no usable key is found (the server would answer every webhook 503).
    """
    if settings.webhook_secrets:
        parsed = parse_stored(settings.webhook_secrets)
        where = "OPSTATE_WEBHOOK_SECRETS"
        path: Path | None = None
        generated = False
    else:
        path = secret_file.absolute()  # never resolve(): a symlink must be seen, not followed
        generated = create_secret_file(path)
        parsed = read_secret_file(path)
        where = f"the webhook secret file {path}"
    if not parsed.keys:
        raise ValueError(f"{where} holds no usable key ({KEY_RULE})")
    origin = "file" if path is not None else "env"
    return SecretSource(parsed.keys, origin, path, generated, tuple(parsed.warnings(where)))


def api_token_for(settings: Settings, secret_file: Path) -> ApiToken:
    """The operations routes' token: ``OPSTATE_API_TOKEN``, else the file beside the secret
    file (generated on first use, mode 0600)."""
    token = checked_api_token(settings.api_token)
    return resolve_api_token(token, token_file_beside(secret_file.absolute()))
