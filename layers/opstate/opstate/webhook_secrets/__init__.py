"""Stored webhook signing secrets: the one place that reads, parses and writes them.

The Lambda (a Secrets Manager value), ``opstate serve`` (a local file or
``OPSTATE_WEBHOOK_SECRETS``) and the CLI (``opstate webhooks register / rotate``) all go through
this package, so they agree on one rule:

- a **key** is ``whsec_`` followed by standard base64 (padding optional) that decodes to at
  least ``MIN_KEY_BYTES`` (24) bytes; Gemini's are 32;
- a line (or list item) starting with ``#`` is a comment, skipped whole; blank lines are skipped;
- any other entry is **ignored**, with one warning that gives its position (``line 3``,
  ``entry 2``), never its value;
- when no key remains, the webhook cannot verify anything: it answers 503 (the sender retries)
  and the secrets alarm fires; it never accepts a request.

Stored shapes read: a JSON list of strings (Secrets Manager, newest first), or text with one
secret per line (a local file; whitespace-separated entries on a line are separate entries).
Bytes that are not UTF-8 are decoded with replacement characters, so they can only make the
entry they sit in unusable (a comment stays a comment).

Writers (``write_secret_file``, ``render_json``, ``update_*``) write keys only: anything else
raises ``ValueError`` before a byte is written. Local updates hold an exclusive ``fcntl`` lock on
a sidecar lock file while they re-read, merge and replace the file; Secrets Manager updates
re-read the current version, check right before writing that ``AWSCURRENT`` is still that
version, and check after writing that their write followed it directly (retrying, and keeping
whatever a concurrent writer added, when it did not).

This package imports no AWS code: Secrets Manager functions take a boto3 client.

The package owns the stored secrets: ``rule`` (keys, parsing, rendering), ``rotation`` (merging
on register / rotate), ``files`` (the local file) and ``secrets_manager`` (Secrets Manager through
a client it is given); every name callers use is re-exported here. It may import the standard
library, ``opstate.private_files`` (the local file's rule) and ``opstate.observability`` (the
warnings), and no AWS code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from opstate.webhook_secrets.rule import (
    GENERATED_KEY_BYTES,
    KEY_RULE,
    MIN_KEY_BYTES,
    SECRET_PREFIX,
    ParsedSecrets,
    SecretConflictError,
    SecretStoreError,
    generate_secret,
    is_key,
    parse_stored,
    render_json,
    render_text,
    require_keys,
    secret_key,
)

if TYPE_CHECKING:
    from opstate.webhook_secrets.files import (
        SecretFileReader,
        create_private_file,
        create_secret_file,
        file_lock,
        lock_path,
        read_secret_file,
        update_secret_file,
        write_secret_file,
    )
    from opstate.webhook_secrets.rotation import (
        MAX_STORED_SECRETS,
        merge_new,
        revoked_by_rotation,
        rotation_change,
        secret_matches,
    )
    from opstate.webhook_secrets.secrets_manager import (
        UPDATE_ATTEMPTS,
        read_secrets_manager,
        update_secrets_manager,
    )

# Loaded on first use: the webhook Lambda needs only the rule (the local file, rotation and
# Secrets Manager writes are the CLI's and opstate serve's).
_WHERE = {
    "SecretFileReader": "files",
    "create_private_file": "files",
    "create_secret_file": "files",
    "file_lock": "files",
    "lock_path": "files",
    "read_secret_file": "files",
    "update_secret_file": "files",
    "write_secret_file": "files",
    "MAX_STORED_SECRETS": "rotation",
    "merge_new": "rotation",
    "revoked_by_rotation": "rotation",
    "rotation_change": "rotation",
    "secret_matches": "rotation",
    "UPDATE_ATTEMPTS": "secrets_manager",
    "read_secrets_manager": "secrets_manager",
    "update_secrets_manager": "secrets_manager",
}

__all__ = [
    "GENERATED_KEY_BYTES",
    "KEY_RULE",
    "MAX_STORED_SECRETS",
    "MIN_KEY_BYTES",
    "SECRET_PREFIX",
    "UPDATE_ATTEMPTS",
    "ParsedSecrets",
    "SecretConflictError",
    "SecretFileReader",
    "SecretStoreError",
    "create_private_file",
    "create_secret_file",
    "file_lock",
    "generate_secret",
    "is_key",
    "lock_path",
    "merge_new",
    "parse_stored",
    "read_secret_file",
    "read_secrets_manager",
    "render_json",
    "render_text",
    "require_keys",
    "revoked_by_rotation",
    "rotation_change",
    "secret_key",
    "secret_matches",
    "update_secret_file",
    "update_secrets_manager",
    "write_secret_file",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'opstate.webhook_secrets' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"opstate.webhook_secrets.{module}"), name)
    globals()[name] = value
    return value
