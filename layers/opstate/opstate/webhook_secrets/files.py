"""The local secret file (``opstate serve``, the CLI): private atomic writes, updates under an
exclusive lock, and a reader that follows the file as it is replaced."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from opstate.private_files import UnsafeFileError, make_private_dir, read_private_file
from opstate.webhook_secrets.rule import (
    ParsedSecrets,
    generate_secret,
    parse_stored,
    render_text,
    require_keys,
)


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock for updating ``path`` (a sidecar lock file, mode 0600), blocking until
    other updaters are done. The secret file itself is replaced atomically, never locked."""
    import fcntl

    make_private_dir(path.parent)
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


SECRET_FILE_WHAT = "the webhook secret file"


def read_secret_file(path: Path) -> ParsedSecrets:
    """The keys of a local secret file: ``OSError`` when it cannot be read, ``UnsafeFileError``
    (a ``ValueError``) when others could read, change or swap it (``opstate.private_files``)."""
    return parse_stored(read_private_file(path, SECRET_FILE_WHAT))


def _write_private(path: Path, text: str) -> None:
    make_private_dir(path.parent)
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
    make_private_dir(path.parent)
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
    read stays in use, and so it does when the file stops following the rule of
    ``opstate.private_files`` (a swap to a symlink, a chmod that lets others write it): the
    file's new content is not trusted, and a warning says so. Feed it to
    ``signatures.SecretsProviderVerifier``.
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
                    self._stamp = stamp
                    self._content = read_private_file(self.path, SECRET_FILE_WHAT)
            except UnsafeFileError as exc:
                _warn_unsafe(exc)
            except OSError:
                pass
            return self._content


def _warn_unsafe(exc: UnsafeFileError) -> None:
    from opstate.observability import logger

    logger.warning("webhook secret file not re-read: %s", exc)
