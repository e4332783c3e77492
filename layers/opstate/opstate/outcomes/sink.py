"""The sink port: the user's storage, as much of it as archiving needs.

An object is written through ``Sink.open(key, name=..., sha256=...)``, a context manager
giving an ``ObjectWriter``: bytes are streamed into it (``write``), then ``commit(sha256)``
makes the object visible under ``key`` with its operation name and sha256 (S3 object
metadata). ``sha256`` given to ``open`` is the digest the bytes must have, known before them
(what Gemini declared, a checked input's): ``commit`` refuses any other, and the S3 sink can
then write straight to the key instead of through a temporary object and a copy. Leaving
the ``with`` block without a commit (an exception, a cut download) leaves nothing under ``key``:
the folder sink removes its temporary file, the S3 sink aborts its multipart upload. So an
object that exists is always whole.

``SinkError`` is a storage fault (``transient``: worth retrying later).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from typing import Protocol

from opstate.private_files import PRIVATE_FILE_MODE


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

    def open(
        self, key: str, *, name: str, sha256: str = ""
    ) -> AbstractContextManager[ObjectWriter]:
        """A writer for the object ``key`` (relative, ``/``-separated) of operation ``name``;
        ``sha256`` (hex, "" when unknown): the digest its bytes must have (``check_digest``)."""
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


def check_digest(expected: str, sha256: str, key: str) -> None:
    """Refuse to commit ``key`` with ``sha256`` when it was opened expecting another digest
    (``SinkError``, not transient: the same bytes would be refused again)."""
    if expected and sha256 != expected:
        raise SinkError(
            f"{key} was to have sha256 {expected}, its bytes have {sha256}; nothing was stored",
            transient=False,
        )


def download(sink: Sink, location: str, folder: int, name: str) -> int:
    """Copy the object at ``location`` to the file ``name`` of the folder open as ``folder``
    (a descriptor: ``opstate.private_files.open_private_dir``); returns its size. The bytes go
    to a new file of a random temporary name created ``O_CREAT|O_EXCL|O_NOFOLLOW`` with mode
    0600 in that folder, renamed onto ``name`` (a link there is replaced, never followed);
    nothing planted in the folder is ever opened."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise SinkError(f"cannot download {location} as {name!r}", transient=False)
    temp = f".{name}.{secrets.token_hex(8)}.part"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    size = 0
    try:
        with os.fdopen(os.open(temp, flags, PRIVATE_FILE_MODE, dir_fd=folder), "wb") as out:
            for chunk in sink.chunks(location):
                out.write(chunk)
                size += len(chunk)
        os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=folder)
    return size
