"""The folder sink (``file:///ABS/PATH``): each object is written to a temporary name in its
own directory, flushed to disk, then renamed into place (``os.replace``, atomic on one file
system). A crash or an exception leaves at most a ``.*.tmp`` file, never the object.

A location is read only after ``resolve``: its path with every ``..`` and link resolved must
be under the root, so neither ``ROOT/../x`` nor a link under the root to a file elsewhere is
ever read. By key the same holds: ``head`` and ``read`` see a link out of the root as no object
(the copy then replaces the link itself, ``os.replace``), and ``open`` refuses to write into a
folder that resolves outside the root."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from opstate.outcomes.sink import SinkError, StoredObject

CHUNK = 1024 * 1024


class _FileWriter:
    def __init__(self, sink: FileSink, key: str, handle: BinaryIO, temp: Path) -> None:
        self.sink = sink
        self.key = key
        self.handle = handle
        self.temp = temp
        self.size = 0
        self.committed: StoredObject | None = None

    def write(self, data: bytes) -> int:
        self.handle.write(data)
        self.size += len(data)
        return len(data)

    def commit(self, sha256: str) -> StoredObject:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        os.replace(self.temp, self.sink.path(self.key))
        self.committed = StoredObject(self.sink.location(self.key), self.size, sha256)
        return self.committed


class FileSink:
    """The ``Sink`` on a local folder."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = self.root.as_uri()

    def path(self, key: str) -> Path:
        parts = [p for p in key.split("/") if p]
        if not parts or any(p in (".", "..") for p in parts):
            raise SinkError(f"invalid object key {key!r}", transient=False)
        return self.root.joinpath(*parts)

    def location(self, key: str) -> str:
        return self.path(key).as_uri()

    def _inside(self, path: Path) -> bool:
        """``path``, its links resolved, is under the root (not the root itself)."""
        real = path.resolve()
        return real != self.root and real.is_relative_to(self.root)

    def _check_folder(self, key: str, folder: Path) -> None:
        """Refuse to write ``key`` when ``folder`` (or its nearest existing ancestor) resolves
        outside the root: a link planted under the root is never written through."""
        existing = folder
        while existing != self.root and not existing.exists():
            existing = existing.parent
        real = existing.resolve()
        if real != self.root and not real.is_relative_to(self.root):
            raise SinkError(
                f"cannot write {key}: its folder {folder} leads outside {self.root}",
                transient=False,
            )

    @contextmanager
    def open(self, key: str, *, name: str) -> Iterator[_FileWriter]:
        target = self.path(key)
        try:
            self._check_folder(key, target.parent)  # before mkdir creates anything through it
            target.parent.mkdir(parents=True, exist_ok=True)
            self._check_folder(key, target.parent)
            temp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
            handle = temp.open("wb")
        except OSError as exc:
            raise SinkError(f"cannot write under {self.root}: {exc}") from exc
        writer = _FileWriter(self, key, handle, temp)
        try:
            yield writer
        finally:
            if not handle.closed:
                handle.close()
            if writer.committed is None:
                temp.unlink(missing_ok=True)

    def head(self, key: str) -> StoredObject | None:
        target = self.path(key)
        try:
            if not self._inside(target):
                return None
            size = target.stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SinkError(f"cannot read {target}: {exc}") from exc
        return StoredObject(target.as_uri(), size, "")

    def read(self, key: str, limit: int) -> bytes | None:
        target = self.path(key)
        try:
            if not self._inside(target):
                return None
            with target.open("rb") as handle:
                return handle.read(limit)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SinkError(f"cannot read {target}: {exc}") from exc

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
        path = self.path(self.resolve(location))
        try:
            with path.open("rb") as handle:
                while chunk := handle.read(CHUNK):
                    yield chunk
        except OSError as exc:
            raise SinkError(f"cannot read {location}: {exc}") from exc
