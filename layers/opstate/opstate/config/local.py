"""The local server's settings (``opstate serve``), and the store it uses without
``--store``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from opstate.config.parse import (
    Part,
    given,
    read_int,
    read_str,
    read_token,
    settings_part,
)
from opstate.config.store import DEFAULT_LOCAL_STORE

DEFAULT_RECONCILE_EVERY_S = 300.0
# The local quarantine's bounds (opstate serve; in AWS the SQS queue's own limits apply).
DEFAULT_QUARANTINE_MAX_ENTRIES = 1000
DEFAULT_QUARANTINE_MAX_BYTES = 64 * 1024 * 1024
MIN_API_TOKEN_LENGTH = 32


def _api_token(env: Mapping[str, str]) -> str | None:
    # As given: only ``opstate serve`` uses it, and checks it (``checked_api_token``), so a
    # short token in the environment does not block ``list`` or ``get``.
    return read_str(env, "OPSTATE_API_TOKEN")


def checked_api_token(token: str | None) -> str | None:
    """``OPSTATE_API_TOKEN`` as ``opstate serve`` takes it: ``ConfigError`` unless it has at
    least ``MIN_API_TOKEN_LENGTH`` characters without spaces; None when unset."""
    given_token = {} if token is None else {"OPSTATE_API_TOKEN": token}
    return read_token(given_token, "OPSTATE_API_TOKEN", MIN_API_TOKEN_LENGTH)


@settings_part
class LocalSettings(Part):
    """The local server (``opstate serve``)."""

    # The bearer token of the operations routes (else generated into a file).
    api_token: str | None = field(default=None, repr=False)
    # Seconds between reconciler passes (with a Gemini API key); ``--reconcile-every`` overrides.
    reconcile_every_s: float = DEFAULT_RECONCILE_EVERY_S
    # The local quarantine keeps at most this many deliveries and bytes of bodies; when full,
    # a signed delivery it would keep is answered 503 (Gemini retries).
    quarantine_max_entries: int = DEFAULT_QUARANTINE_MAX_ENTRIES
    quarantine_max_bytes: int = DEFAULT_QUARANTINE_MAX_BYTES

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        return given(
            api_token=_api_token(env),
            quarantine_max_entries=read_int(env, "OPSTATE_QUARANTINE_MAX_ENTRIES", minimum=1),
            quarantine_max_bytes=read_int(env, "OPSTATE_QUARANTINE_MAX_BYTES", minimum=1),
        )


def serve_store_url(env: Mapping[str, str] | None = None) -> str:
    """The store ``opstate serve`` uses without ``--store``: ``OPSTATE_STORE``, else the local
    SQLite file. ``OPSTATE_TABLE_NAME`` (the deployed table, which the other commands default
    to) is not used: a local server writes a deployed table only when told to with ``--store``
    or ``OPSTATE_STORE``."""
    return read_str(os.environ if env is None else env, "OPSTATE_STORE") or DEFAULT_LOCAL_STORE
