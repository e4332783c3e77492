"""Where ``opstate webhooks`` keeps the signing secrets: the local file ``opstate serve`` reads,
or a Secrets Manager secret.

Parsing, merging and the concurrency-safe writes are ``opstate.webhook_secrets``' (one rule for
every reader and writer); this module adapts them to the CLI: errors become ``CliError``
sentences, ignored entries one warning each on stderr, and each target can say which options
name it (``--secret-file PATH`` / ``--secret-arn ARN``) so a recovery hint repeats exactly the
destination that was used.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from opstate.cli.common import CliError, err
from opstate.private_files import UnsafeFileError
from opstate.webhook_secrets import (
    ParsedSecrets,
    SecretStoreError,
    read_secret_file,
    read_secrets_manager,
    update_secret_file,
    update_secrets_manager,
)

Change = Callable[[Sequence[str]], Sequence[str]]


class SecretTarget(Protocol):
    description: str

    def read(self) -> list[str]:
        """The stored keys, newest first (ignored entries are warned about on stderr)."""
        ...

    def update(self, change: Change) -> list[str]:
        """Re-read, apply ``change`` and write, safe against a concurrent update; the keys
        written. Raises ``CliError`` (or the store's own error) when it cannot."""
        ...

    def options(self) -> list[str]:
        """The command-line options that name this destination."""
        ...


def _warn(parsed: ParsedSecrets, where: str) -> list[str]:
    for warning in parsed.warnings(where):
        err(f"warning: {warning}")
    return list(parsed.keys)


class FileSecretTarget:
    """The local secret file ``opstate serve`` reads (one key per line, newest first)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.description = f"the local file {path}"

    def read(self) -> list[str]:
        try:
            parsed = read_secret_file(self.path)
        except FileNotFoundError:
            return []
        except UnsafeFileError as exc:  # others could read, change or swap it
            raise CliError(str(exc)) from None
        except OSError as exc:
            raise CliError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        return _warn(parsed, self.description)

    def update(self, change: Change) -> list[str]:
        try:
            return update_secret_file(self.path, change)
        except UnsafeFileError as exc:
            raise CliError(str(exc)) from None
        except OSError as exc:
            raise CliError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def options(self) -> list[str]:
        return ["--secret-file", str(self.path)]


class SecretsManagerTarget:
    """A Secrets Manager secret whose value is a JSON list of ``whsec_`` keys, newest first."""

    def __init__(self, secret_id: str, client: Any = None) -> None:
        if client is None:
            import boto3

            client = boto3.client("secretsmanager")
        self.secret_id = secret_id
        self.description = f"Secrets Manager secret {secret_id}"
        self._client = client

    def read(self) -> list[str]:
        try:
            parsed, _ = read_secrets_manager(self._client, self.secret_id)
        except SecretStoreError as exc:
            raise CliError(str(exc)) from None
        except Exception as exc:  # credentials, endpoint: botocore's own errors
            raise CliError(f"cannot read {self.description}: {exc}") from None
        return _warn(parsed, self.description)

    def update(self, change: Change) -> list[str]:
        try:
            return update_secrets_manager(self._client, self.secret_id, change)
        except SecretStoreError as exc:
            raise CliError(str(exc)) from None

    def options(self) -> list[str]:
        return ["--secret-arn", self.secret_id]


def secret_target(secret_arn: str | None, secret_file: Path) -> SecretTarget:
    """The Secrets Manager secret if an ARN is given, else the local file."""
    if secret_arn:
        return SecretsManagerTarget(secret_arn)
    return FileSecretTarget(secret_file)


def rotate_command(webhook_id: str, target: SecretTarget) -> str:
    """The exact ``opstate webhooks rotate`` that stores a fresh secret where ``target`` is."""
    return shlex.join(["opstate", "webhooks", "rotate", "--id", webhook_id, *target.options()])
