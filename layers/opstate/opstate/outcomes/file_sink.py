"""The folder sink (``file:///ABS/PATH``): each object is written to a temporary name in its
own directory, flushed to disk, then renamed into place (``os.replace``, atomic on one file
system). A crash or an exception leaves at most a ``.*.tmp`` file, never the object.

What it writes is private (issue 38): folders are created 0700 and files 0600 (kept inputs hold
the user's prompts); a tree an older release wrote 0755/0644 is read as it is.

No link is ever followed below the root, so a link swapped in between a check and a use cannot
redirect a read or a write: every folder of a key is opened relative to the one before it
(``os.open(part, O_DIRECTORY | O_NOFOLLOW, dir_fd=parent)``) and the object itself with
``O_NOFOLLOW`` in the last folder's descriptor; the temporary file is created ``O_EXCL`` there
and renamed within it (a link at the object's name is replaced, never written through). By key,
``head`` and ``read`` see a link (or a folder that is one) as no object, and ``open`` refuses to
write through one. A location is read only after ``resolve``: its path with every ``..`` and
link resolved must be under the root (so neither ``ROOT/../x`` nor a link under the root to a
file elsewhere is read), and it is then opened by key as above."""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from opstate.outcomes.sink import SinkError, StoredObject, check_digest
from opstate.private_files import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE

CHUNK = 1024 * 1024
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
# What ``open(O_NOFOLLOW)`` answers for a link (ELOOP; EMLINK on some BSDs), or a folder
# opened with ``O_DIRECTORY`` that is a file or a link (ENOTDIR).
_LINK_ERRORS = frozenset({errno.ELOOP, errno.EMLINK, errno.ENOTDIR})


class _LinkFound(Exception):
    """A folder or object of a key is a link (or not a folder): never followed."""


class _FileWriter:
    def __init__(
        self, sink: FileSink, key: str, handle: BinaryIO, folder: int, temp: str, expected: str
    ) -> None:
        self.sink = sink
        self.expected = expected
        self.key = key
        self.handle = handle
        self.folder = folder
        self.temp = temp
        self.size = 0
        self.committed: StoredObject | None = None

    def write(self, data: bytes) -> int:
        self.handle.write(data)
        self.size += len(data)
        return len(data)

    def commit(self, sha256: str) -> StoredObject:
        check_digest(self.expected, sha256, self.key)
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        name = self.sink.parts(self.key)[-1]
        os.replace(self.temp, name, src_dir_fd=self.folder, dst_dir_fd=self.folder)
        self.committed = StoredObject(self.sink.location(self.key), self.size, sha256)
        return self.committed


class FileSink:
    """The ``Sink`` on a local folder."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = self.root.as_uri()

    def parts(self, key: str) -> list[str]:
        parts = [p for p in key.split("/") if p]
        if not parts or any(p in (".", "..") for p in parts):
            raise SinkError(f"invalid object key {key!r}", transient=False)
        return parts

    def path(self, key: str) -> Path:
        return self.root.joinpath(*self.parts(key))

    def location(self, key: str) -> str:
        return self.path(key).as_uri()

    def _folder(self, parts: list[str], *, create: bool) -> int | None:
        """A descriptor of the folder ``ROOT/parts...``, each folder opened in the one before
        it without following a link (``_LinkFound`` when one is a link); created 0700 when
        missing and ``create``, else None when missing."""
        if create and not self.root.is_dir():
            with suppress(FileExistsError):
                self.root.mkdir(mode=PRIVATE_DIR_MODE, parents=True)
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            for part in parts:
                try:
                    step = os.open(part, _FOLDER, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    with suppress(FileExistsError):
                        os.mkdir(part, PRIVATE_DIR_MODE, dir_fd=fd)
                    step = os.open(part, _FOLDER, dir_fd=fd)
                os.close(fd)
                fd = step
        except OSError as exc:
            os.close(fd)
            if exc.errno in _LINK_ERRORS:
                raise _LinkFound(part) from None
            raise
        return fd

    def _open_object(self, key: str) -> int | None:
        """A read descriptor of the regular file ``key`` (None when absent); ``_LinkFound``
        when it, or a folder on its way, is a link or not what it should be."""
        parts = self.parts(key)
        folder = self._folder(parts[:-1], create=False)
        if folder is None:
            return None
        try:
            fd = os.open(parts[-1], _READ, dir_fd=folder)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in _LINK_ERRORS:
                raise _LinkFound(parts[-1]) from None
            raise
        finally:
            os.close(folder)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise _LinkFound(parts[-1])
        return fd

    @contextmanager
    def open(self, key: str, *, name: str, sha256: str = "") -> Iterator[_FileWriter]:
        parts = self.parts(key)
        try:
            folder = self._folder(parts[:-1], create=True)
        except _LinkFound as found:
            raise SinkError(
                f"cannot write {key}: {found} on its way is a link, which may lead outside "
                f"{self.root}; links are never followed",
                transient=False,
            ) from None
        except OSError as exc:
            raise SinkError(f"cannot write under {self.root}: {exc}") from exc
        assert folder is not None
        temp = f".{parts[-1]}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            handle = os.fdopen(os.open(temp, _CREATE, PRIVATE_FILE_MODE, dir_fd=folder), "wb")
        except OSError as exc:
            os.close(folder)
            raise SinkError(f"cannot write under {self.root}: {exc}") from exc
        writer = _FileWriter(self, key, handle, folder, temp, sha256)
        try:
            yield writer
        finally:
            if not handle.closed:
                handle.close()
            if writer.committed is None:
                with suppress(FileNotFoundError):
                    os.unlink(temp, dir_fd=folder)
            os.close(folder)

    def head(self, key: str) -> StoredObject | None:
        target = self.path(key)
        try:
            fd = self._open_object(key)
        except _LinkFound:
            return None
        except OSError as exc:
            raise SinkError(f"cannot read {target}: {exc}") from exc
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        return StoredObject(target.as_uri(), size, "")

    def read(self, key: str, limit: int) -> bytes | None:
        target = self.path(key)
        try:
            fd = self._open_object(key)
        except _LinkFound:
            return None
        except OSError as exc:
            raise SinkError(f"cannot read {target}: {exc}") from exc
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as handle:
            return handle.read(limit)

    def resolve(self, location: str) -> str:
        parts = urlsplit(location)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            raise SinkError(f"{location} is not a file of {self.url}", transient=False)
        path = Path(unquote(parts.path))
        real = path.resolve() if path.is_absolute() else None
        if real is None or real == self.root or not real.is_relative_to(self.root):
            raise SinkError(f"{location} is outside {self.url}", transient=False)
        return real.relative_to(self.root).as_posix()

    def chunks(self, location: str) -> Iterator[bytes]:
        key = self.resolve(location)
        try:
            fd = self._open_object(key)
        except _LinkFound:
            raise SinkError(
                f"cannot read {location}: a link on its way is never followed", transient=False
            ) from None
        except OSError as exc:
            raise SinkError(f"cannot read {location}: {exc}") from exc
        if fd is None:
            raise SinkError(f"cannot read {location}: no such object")
        try:
            with os.fdopen(fd, "rb") as handle:
                while chunk := handle.read(CHUNK):
                    yield chunk
        except OSError as exc:
            raise SinkError(f"cannot read {location}: {exc}") from exc
