"""The sink port: the user's storage, as much of it as archiving needs.

An object is written through ``Sink.open(key, name=...)``, a context manager giving an
``ObjectWriter``: bytes are streamed into it (``write``), then ``commit(sha256)`` makes the
object visible under ``key`` with its operation name and sha256 (S3 object metadata). Leaving
the ``with`` block without a commit (an exception, a cut download) leaves nothing under ``key``:
the folder sink removes its temporary file, the S3 sink aborts its multipart upload. So an
object that exists is always whole.

``SinkError`` is a storage fault (``transient``: worth retrying later).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class SinkError(Exception):
    """The storage refused or failed a call."""

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One archived object: its URI (``s3://`` or ``file://``), size and sha256 (``""`` when
    the storage keeps none, e.g. a folder)."""

    location: str
    size: int
    sha256: str

    def as_dict(self) -> dict[str, object]:
        return {"location": self.location, "bytes": self.size, "sha256": self.sha256}


class ObjectWriter(Protocol):
    """A writable stream into one object being archived."""

    def write(self, data: bytes) -> int: ...

    def commit(self, sha256: str) -> StoredObject:
        """Make the object visible under its key (the bytes written so far, whole)."""
        ...


class Sink(Protocol):
    """Where archived results go (``file://`` folder or ``s3://`` bucket and prefix)."""

    url: str

    def open(self, key: str, *, name: str) -> AbstractContextManager[ObjectWriter]:
        """A writer for the object ``key`` (relative, ``/``-separated) of operation ``name``."""
        ...

    def head(self, key: str) -> StoredObject | None:
        """The stored object ``key``, or None when there is none."""
        ...

    def read(self, key: str, limit: int) -> bytes | None:
        """A small object's bytes (``summary.json``), None when absent; at most ``limit``."""
        ...

    def resolve(self, location: str) -> str:
        """The key of the object at ``location`` (a URI this sink gave), every ``..`` and
        link in it resolved; ``SinkError`` (not transient) when that is not an object under
        the sink's root (a folder, or a bucket and prefix)."""
        ...

    def chunks(self, location: str) -> Iterator[bytes]:
        """The bytes of the object at ``location`` (a URI this sink gave, ``resolve``d first:
        never one outside the root), streamed."""
        ...

    def location(self, key: str) -> str:
        """The URI of ``key``."""
        ...


def download(sink: Sink, location: str, dest: Path) -> int:
    """Copy the object at ``location`` to the file ``dest`` (temporary name, then rename);
    returns its size."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    temp = dest.with_name(f".{dest.name}.part")
    size = 0
    try:
        with temp.open("wb") as out:
            for chunk in sink.chunks(location):
                out.write(chunk)
                size += len(chunk)
        temp.replace(dest)
    finally:
        temp.unlink(missing_ok=True)
    return size
