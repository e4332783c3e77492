"""Secrets Manager reads and concurrency-safe updates (a boto3 ``secretsmanager`` client is passed
in: no AWS code is imported here)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from opstate.webhook_secrets.rule import (
    ParsedSecrets,
    SecretConflictError,
    SecretStoreError,
    parse_stored,
    render_json,
    require_keys,
)

# Attempts of a Secrets Manager update against concurrent writers before giving up.
UPDATE_ATTEMPTS = 5


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _is_aws_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("botocore", "boto3"))


def _describe_stages(client: Any, secret_id: str) -> dict[str, list[str]]:
    answer = client.describe_secret(SecretId=secret_id)
    stages = answer.get("VersionIdsToStages") or {}
    return {str(k): list(v) for k, v in stages.items()}


def _version_with(stages: dict[str, list[str]], stage: str) -> str | None:
    for version, labels in stages.items():
        if stage in labels:
            return version
    return None


def read_secrets_manager(
    client: Any, secret_id: str, *, version_id: str | None = None
) -> tuple[ParsedSecrets, str | None]:
    """The keys of a Secrets Manager secret (``AWSCURRENT``, or ``version_id``) and the version
    read. A secret that exists but has no value yet reads as no keys and version None."""
    try:
        if version_id is None:
            answer = client.get_secret_value(SecretId=secret_id)
        else:
            answer = client.get_secret_value(SecretId=secret_id, VersionId=version_id)
    except Exception as exc:
        if not _is_aws_error(exc):
            raise
        if _error_code(exc) == "ResourceNotFoundException" and version_id is None:
            try:
                _describe_stages(client, secret_id)
            except Exception:
                raise SecretStoreError(
                    f"cannot read Secrets Manager secret {secret_id}: {exc}"
                ) from None
            return ParsedSecrets(()), None  # it exists, with no value yet
        raise SecretStoreError(f"cannot read Secrets Manager secret {secret_id}: {exc}") from None
    raw: str | bytes = answer.get("SecretString")
    if raw is None:
        raw = answer.get("SecretBinary") or b""
    return parse_stored(raw), answer.get("VersionId")


def update_secrets_manager(
    client: Any,
    secret_id: str,
    change: Callable[[Sequence[str]], Sequence[str]],
    *,
    attempts: int = UPDATE_ATTEMPTS,
) -> list[str]:
    """Apply ``change`` to the keys of ``secret_id`` without losing a concurrent writer's keys.

    Each attempt: read ``AWSCURRENT`` (keys and VersionId), apply ``change``, check that
    ``AWSCURRENT`` is still that version right before writing (else start over), write, then
    check that the version our write demoted to ``AWSPREVIOUS`` is the one we read. When it is
    not, another writer slipped in between: its keys are carried into the next attempt, which
    merges them with the current value and writes again. Returns the keys finally written;
    raises ``SecretConflictError`` after ``attempts`` lost races.
    """
    carried: list[str] = []
    for _ in range(attempts):
        parsed, based_on = read_secrets_manager(client, secret_id)
        base = list(parsed.keys) + [k for k in carried if k not in parsed.keys]
        keys = require_keys(change(base))
        if keys == list(parsed.keys):
            return keys  # nothing to change: no new version
        try:
            if _version_with(_describe_stages(client, secret_id), "AWSCURRENT") != based_on:
                continue  # changed while we computed: read it again
            written = client.put_secret_value(
                SecretId=secret_id,
                SecretString=render_json(keys),
                ClientRequestToken=str(uuid.uuid4()),
            )["VersionId"]
            stages = _describe_stages(client, secret_id)
        except Exception as exc:
            if not _is_aws_error(exc):
                raise
            raise SecretStoreError(
                f"cannot write Secrets Manager secret {secret_id}: {exc}"
            ) from None
        previous = _version_with(stages, "AWSPREVIOUS")
        current = _version_with(stages, "AWSCURRENT")
        if previous == based_on and current == written:
            return keys
        # Someone wrote between our check and our write, or right after it: keep their keys
        # (the version ours replaced, and the current one) and apply the change again.
        for version in {previous, current} - {None, written, based_on}:
            assert version is not None
            other, _ = read_secrets_manager(client, secret_id, version_id=version)
            carried.extend(k for k in other.keys if k not in carried)
    raise SecretConflictError(
        f"Secrets Manager secret {secret_id} kept changing during {attempts} attempts to update "
        "it; run the command again"
    )
