"""Where ``opstate webhooks`` keeps the signing secrets: the local file ``opstate serve`` reads,
or a Secrets Manager secret; merging a new secret in and pruning revoked ones."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from opstate.cli.common import CliError

# A stored secret list never grows beyond this many entries (newest kept).
MAX_STORED_SECRETS = 8


class SecretTarget(Protocol):
    description: str

    def read(self) -> list[str]: ...

    def write(self, secrets: Sequence[str]) -> None: ...


class FileSecretTarget:
    """The local secret file ``opstate serve`` reads (one secret per line, newest first)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.description = f"the local file {path}"

    def read(self) -> list[str]:
        from opstate.local.secret_file import read_secret_file

        try:
            return read_secret_file(self.path)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CliError(f"cannot read {self.path}: {exc.strerror or exc}") from None

    def write(self, secrets: Sequence[str]) -> None:
        from opstate.local.secret_file import write_secret_file

        write_secret_file(self.path, secrets)


class SecretsManagerTarget:
    """A Secrets Manager secret whose value is a JSON list of ``whsec_`` secrets, newest first."""

    def __init__(self, secret_id: str) -> None:
        import boto3

        self.secret_id = secret_id
        self.description = f"Secrets Manager secret {secret_id}"
        self._client = boto3.client("secretsmanager")

    def read(self) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            value = self._client.get_secret_value(SecretId=self.secret_id)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ResourceNotFoundException" and self._exists():
                return []  # the secret exists but has no value yet
            raise CliError(f"cannot read {self.description}: {exc}") from None
        except BotoCoreError as exc:
            raise CliError(f"cannot read {self.description}: {exc}") from None
        return parse_stored_secrets(value.get("SecretString") or "")

    def _exists(self) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.describe_secret(SecretId=self.secret_id)
        except (ClientError, BotoCoreError):
            return False
        return True

    def write(self, secrets: Sequence[str]) -> None:
        self._client.put_secret_value(SecretId=self.secret_id, SecretString=json.dumps(secrets))


def parse_stored_secrets(text: str) -> list[str]:
    """A stored value: a JSON list, or whitespace-separated secrets; non-``whsec_`` entries
    (placeholders) are ignored."""
    stripped = text.strip()
    items: list[Any]
    if stripped.startswith("["):
        try:
            loaded = json.loads(stripped)
        except ValueError:
            loaded = []
        items = loaded if isinstance(loaded, list) else []
    else:
        items = stripped.split()
    return [i.strip() for i in items if isinstance(i, str) and i.strip().startswith("whsec_")]


def merge_secrets(new: str, existing: Sequence[str]) -> list[str]:
    """The new secret first, then the previous ones (deduplicated), at most MAX_STORED_SECRETS."""
    merged = [new]
    for secret in existing:
        if secret not in merged:
            merged.append(secret)
    return merged[:MAX_STORED_SECRETS]


_TRUNCATION = re.compile(r"\.{2,}|…|\*+")


def secret_matches(secret: str, truncated: str) -> bool:
    """Whether a full secret is the one a truncated form (``whsec_AbC...xYz``) shows."""
    if not truncated:
        return False
    parts = _TRUNCATION.split(truncated)
    if len(parts) == 1:
        return secret == truncated
    head, tail = parts[0], parts[-1]
    if not head and not tail:
        return False
    for candidate in (secret, secret.removeprefix("whsec_")):
        if (
            candidate.startswith(head)
            and candidate.endswith(tail)
            and len(candidate) >= len(head) + len(tail)
        ):
            return True
    return False


def prune_secrets(
    secrets: Sequence[str], new: str, webhooks: Sequence[Any], now: datetime
) -> list[str]:
    """Drop stored secrets Gemini no longer lists (revoked or expired).

    Only when the answer is trustworthy: Gemini lists truncated secrets and the new secret
    matches one of them. Otherwise everything is kept (a secret kept too long is harmless; a
    secret dropped too early loses deliveries).
    """
    live: list[str] = []
    for webhook in webhooks:
        for entry in getattr(webhook, "signing_secrets", None) or ():
            truncated = getattr(entry, "truncated_secret", None)
            expires = getattr(entry, "expire_time", None)
            if not truncated:
                continue
            if isinstance(expires, datetime) and expires.tzinfo is not None and expires <= now:
                continue
            live.append(truncated)
    if not any(secret_matches(new, t) for t in live):
        return list(secrets)
    return [s for s in secrets if s == new or any(secret_matches(s, t) for t in live)]


def secret_target(secret_arn: str | None, secret_file: Path) -> SecretTarget:
    """The Secrets Manager secret if an ARN is given, else the local file."""
    if secret_arn:
        return SecretsManagerTarget(secret_arn)
    return FileSecretTarget(secret_file)
