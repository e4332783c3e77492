"""The folder sink (``file:///ABS/PATH``): each object is written to a temporary name in its
own directory, flushed to disk, then renamed into place (``os.replace``, atomic on one file
system). A crash or an exception leaves at most a ``.*.tmp`` file, never the object."""

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

    @contextmanager
    def open(self, key: str, *, name: str) -> Iterator[_FileWriter]:
        target = self.path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
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
            size = target.stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SinkError(f"cannot read {target}: {exc}") from exc
        return StoredObject(target.as_uri(), size, "")

    def read(self, key: str, limit: int) -> bytes | None:
        target = self.path(key)
        try:
            with target.open("rb") as handle:
                return handle.read(limit)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SinkError(f"cannot read {target}: {exc}") from exc

    def chunks(self, location: str) -> Iterator[bytes]:
        path = Path(unquote(urlsplit(location).path))
        if not path.is_relative_to(self.root):
            raise SinkError(f"{location} is not under {self.url}", transient=False)
        with path.open("rb") as handle:
            while chunk := handle.read(CHUNK):
                yield chunk
