"""Stored webhook signing secrets: the one place that reads, parses and writes them.

The Lambda (a Secrets Manager value), ``opstate serve`` (a local file or
``OPSTATE_WEBHOOK_SECRETS``) and the CLI (``opstate webhooks register / rotate``) all go through
this module, so they agree on one rule:

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

This module imports no AWS code: Secrets Manager functions take a boto3 client.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import re
import secrets as secrets_module
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECRET_PREFIX = "whsec_"
MIN_KEY_BYTES = 24
GENERATED_KEY_BYTES = 32
# A stored list never grows beyond this many keys (newest kept). Rotation prunes what Gemini
# revoked, so only many projects sharing one store come near it.
MAX_STORED_SECRETS = 32
# Attempts of a Secrets Manager update against concurrent writers before giving up.
UPDATE_ATTEMPTS = 5

_BASE64_BODY = re.compile(r"[A-Za-z0-9+/]+={0,2}", re.ASCII)
_TRUNCATION = re.compile(r"\.{2,}|…|\*+")

KEY_RULE = f"'{SECRET_PREFIX}' + base64 of at least {MIN_KEY_BYTES} bytes"


class SecretStoreError(Exception):
    """A secret store could not be read or written. The message names the store, never a value."""


class SecretConflictError(SecretStoreError):
    """Concurrent writers kept changing the stored secrets; nothing was lost, nothing written."""


# --------------------------------------------------------------------------------------------
# The rule


def secret_key(entry: str) -> bytes | None:
    """The HMAC key a stored entry stands for, or None when the entry is not a key."""
    if not entry.startswith(SECRET_PREFIX):
        return None
    body = entry[len(SECRET_PREFIX) :]
    if _BASE64_BODY.fullmatch(body) is None:
        return None
    try:
        key = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return key if len(key) >= MIN_KEY_BYTES else None


def is_key(entry: str) -> bool:
    return secret_key(entry) is not None


def generate_secret() -> str:
    """A new key: ``whsec_`` + base64 of 32 random bytes (the shape Gemini issues)."""
    raw = secrets_module.token_bytes(GENERATED_KEY_BYTES)
    return SECRET_PREFIX + base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True, slots=True)
class ParsedSecrets:
    """The keys of a stored value (newest first, deduplicated) and where the ignored entries
    were (positions only: a value is never kept or shown)."""

    keys: tuple[str, ...]
    ignored: tuple[str, ...] = ()

    def warnings(self, where: str) -> list[str]:
        """One sentence per ignored entry, naming ``where`` and the entry's position."""
        return [
            f"{where}: {position} is not a webhook secret ({KEY_RULE}); ignored"
            for position in self.ignored
        ]


def _collect(entries: Iterable[tuple[str, object]]) -> ParsedSecrets:
    keys: list[str] = []
    ignored: list[str] = []
    for position, entry in entries:
        if not isinstance(entry, str):
            ignored.append(position)
            continue
        text = entry.strip()
        if not text or text.startswith("#"):
            continue
        if not is_key(text):
            ignored.append(position)
        elif text not in keys:
            keys.append(text)
    return ParsedSecrets(tuple(keys), tuple(ignored))


def _text_entries(text: str) -> Iterator[tuple[str, str]]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # a comment is skipped whole, whatever it holds
        words = stripped.split()
        if len(words) == 1:
            yield f"line {lineno}", words[0]
        else:
            for index, word in enumerate(words, start=1):
                yield f"line {lineno}, entry {index}", word


def parse_stored(value: str | bytes | Sequence[object]) -> ParsedSecrets:
    """The keys of a stored value: text (one secret per line), a JSON list of strings, bytes
    (UTF-8 text or JSON), or an already split sequence of entries."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                loaded = json.loads(stripped)
            except (ValueError, RecursionError):
                loaded = None
            if isinstance(loaded, list):
                return parse_stored(loaded)
        return _collect(_text_entries(value))
    return _collect((f"entry {i}", item) for i, item in enumerate(value, start=1))


def require_keys(keys: Iterable[str]) -> list[str]:
    """``keys`` as a list, after checking every one is a key (writers call this first)."""
    checked = list(keys)
    for position, entry in enumerate(checked, start=1):
        if not is_key(entry):
            raise ValueError(f"refusing to store entry {position}: it is not a key ({KEY_RULE})")
    return checked


def render_json(keys: Iterable[str]) -> str:
    """The Secrets Manager value: a JSON list of keys, newest first."""
    return json.dumps(require_keys(keys))


def render_text(keys: Iterable[str]) -> str:
    """The local file's content: one key per line, newest first, nothing else."""
    return "".join(f"{k}\n" for k in require_keys(keys))


# --------------------------------------------------------------------------------------------
# Merging (rotation, registration)


def merge_new(new: str, existing: Sequence[str], limit: int = MAX_STORED_SECRETS) -> list[str]:
    """``new`` first, then ``existing`` (deduplicated), at most ``limit`` keys."""
    merged = [new]
    for key in existing:
        if key not in merged:
            merged.append(key)
    return merged[:limit]


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
    for candidate in (secret, secret.removeprefix(SECRET_PREFIX)):
        if (
            candidate.startswith(head)
            and candidate.endswith(tail)
            and len(candidate) >= len(head) + len(tail)
        ):
            return True
    return False


def revoked_by_rotation(
    stored: Sequence[str], new: str, listed_before: Sequence[str], listed_after: Sequence[str]
) -> set[str]:
    """The stored keys a rotation made useless: those the rotated webhook listed (truncated)
    before the rotation and no longer lists after it.

    Nothing else is ever dropped: keys of another Gemini project, or added by hand, match nothing
    this webhook listed before. When the answer cannot be trusted (the new secret matches nothing
    listed after the rotation, or an old key matches both lists) the key is kept: a key kept too
    long is harmless, one dropped too early loses deliveries.
    """
    if not any(secret_matches(new, t) for t in listed_after):
        return set()
    dropped: set[str] = set()
    for key in stored:
        if key == new:
            continue
        was_listed = any(secret_matches(key, t) for t in listed_before)
        still_listed = any(secret_matches(key, t) for t in listed_after)
        if was_listed and not still_listed:
            dropped.add(key)
    return dropped


def rotation_change(
    new: str, *, listed_before: Sequence[str] = (), listed_after: Sequence[str] = ()
) -> Callable[[Sequence[str]], list[str]]:
    """The change a register / rotate applies to the keys read right before writing: ``new``
    first, minus what ``revoked_by_rotation`` says this rotation made useless (decided on the
    keys as they are at write time, so a key another writer added meanwhile is kept)."""

    def change(current: Sequence[str]) -> list[str]:
        dropped = revoked_by_rotation(current, new, listed_before, listed_after)
        return merge_new(new, [k for k in current if k not in dropped])

    return change


# --------------------------------------------------------------------------------------------
# Local file


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock for updating ``path`` (a sidecar lock file, mode 0600), blocking until
    other updaters are done. The secret file itself is replaced atomically, never locked."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def read_secret_file(path: Path) -> ParsedSecrets:
    """The keys of a local secret file (``OSError`` when it cannot be read)."""
    return parse_stored(path.read_bytes())


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_secret_file(path: Path, keys: Sequence[str]) -> None:
    """Replace ``path`` atomically with ``keys`` (newest first), mode 0600. Keys only."""
    _write_private(path, render_text(keys))


def create_private_file(path: Path, content: str) -> bool:
    """Create ``path`` (mode 0600) holding ``content`` unless it exists; True if this call did.

    The content is written to a temporary file first and linked into place, so no reader ever
    sees a half-written file and two processes starting at once keep the first one's content.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def create_secret_file(path: Path) -> bool:
    """Generate a key into ``path`` if it does not exist (mode 0600); True if this call did.

    Written aside and linked into place: no reader sees a half-written file, and of two
    processes starting at once the first one's key is kept.
    """
    return create_private_file(path, render_text([generate_secret()]))


def update_secret_file(path: Path, change: Callable[[Sequence[str]], Sequence[str]]) -> list[str]:
    """Re-read ``path`` under the lock, apply ``change`` to its keys and write the result.

    A missing file reads as no keys. Returns the keys written. Concurrent updaters are
    serialised, so each one's change is applied to what the previous one wrote.
    """
    with file_lock(path):
        try:
            current = read_secret_file(path).keys
        except FileNotFoundError:
            current = ()
        keys = require_keys(change(current))
        write_secret_file(path, keys)
        return keys


class SecretFileReader:
    """The raw content of a local secret file, re-read when the file changes on disk.

    ``opstate webhooks register / rotate`` replace the file while ``opstate serve`` runs; the
    next request sees the new content. If the file vanishes or cannot be read, the last content
    read stays in use. Feed it to ``signatures.SecretsProviderVerifier``.
    """

    def __init__(self, path: Path) -> None:
        import threading

        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._content = b""
        self()

    def __call__(self) -> bytes:
        with self._lock:
            try:
                stat = self.path.stat()
                stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
                if stamp != self._stamp:
                    self._content = self.path.read_bytes()
                    self._stamp = stamp
            except OSError:
                pass
            return self._content


# --------------------------------------------------------------------------------------------
# Secrets Manager (a boto3 "secretsmanager" client is passed in)


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
