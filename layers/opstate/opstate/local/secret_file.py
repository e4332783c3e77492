"""The local webhook secret file: generated once, read on change, rewritten atomically.

``opstate serve`` reads it (``resolve_secrets``, ``SecretFileProvider``); the CLI's
``webhooks register`` / ``rotate`` write it (``write_secret_file``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import secrets as secrets_module
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

from opstate.config import Settings

DEFAULT_SECRET_FILE = Path(".opstate") / "webhook-secret"
SECRET_PREFIX = "whsec_"


def generate_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets_module.token_bytes(32)).decode("ascii")


def read_secret_file(path: Path) -> list[str]:
    """The secrets in a local secret file: one per line (or whitespace-separated), newest first."""
    text = path.read_text(encoding="utf-8")
    return [token for token in text.split() if token and not token.startswith("#")]


def write_secret_file(path: Path, secrets: Sequence[str]) -> None:
    """Write ``secrets`` (newest first) atomically, readable by the owner only (mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("".join(f"{s}\n" for s in secrets))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


class SecretFileProvider:
    """The secrets of a local file, re-read when the file changes on disk.

    ``opstate webhooks register`` / ``rotate`` rewrite the file while ``opstate serve`` runs;
    the next request sees the new secrets without a restart. If the file vanishes or cannot be
    read, the last secrets read stay in use.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._secrets: tuple[str, ...] = tuple(read_secret_file(path))

    def __call__(self) -> tuple[str, ...]:
        with self._lock:
            try:
                stat = self._path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
                if stamp != self._stamp:
                    found = tuple(read_secret_file(self._path))
                    if found:
                        self._secrets = found
                    self._stamp = stamp
            except OSError:
                pass
            return self._secrets


@dataclasses.dataclass(frozen=True)
class SecretSource:
    """Where the webhook secrets come from, for the start-up banner."""

    secrets: tuple[str, ...]
    origin: str  # "env" or "file"
    path: Path | None
    generated: bool


def resolve_secrets(settings: Settings, secret_file: Path) -> SecretSource:
    """``OPSTATE_WEBHOOK_SECRETS`` if set; else the secret file, generated once if missing."""
    if settings.webhook_secrets:
        return SecretSource(tuple(settings.webhook_secrets), "env", None, False)
    path = secret_file.resolve()
    generated = False
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = generate_secret()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process created it first: use theirs
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(secret + "\n")
            os.chmod(path, 0o600)
            generated = True
    found = read_secret_file(path)
    if not found:
        raise ValueError(f"the webhook secret file {path} holds no secret")
    return SecretSource(tuple(found), "file", path, generated)
