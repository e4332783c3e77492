"""The source port: what archiving needs of Gemini, nothing more.

``outputs(record)`` says what a terminal operation's results are (``Outputs``: the objects to
copy, each a Gemini file to stream or bytes already in hand, Gemini's own deletion time, the
batch's request count, content-filtered videos); ``download(file, writer)`` streams one file's
bytes into ``writer`` (anything with ``write``) without holding them. Failures are
``SourceError`` (``status`` is the HTTP status, ``transient``: worth retrying later).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from opstate.domain.model import OpRecord

# What an object is, which says how it is summarised.
BATCH_OUTPUT = "batch"  # JSON Lines, one row per request: the ledger counts it
VIDEO = "video"
DOCUMENT = "document"  # a JSON document (the final interaction)


class SourceError(Exception):
    def __init__(self, message: str, *, status: int | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient

    @property
    def not_found(self) -> bool:
        return self.status == 404


class Writer(Protocol):
    def write(self, data: bytes) -> int: ...


@dataclass(frozen=True, slots=True)
class Output:
    """One object to archive: ``key`` (``output.jsonl``, ``video-0.mp4``, ...), ``what`` it is
    (``BATCH_OUTPUT``, ``VIDEO``, ``DOCUMENT``) and either the Gemini ``file`` to stream
    (``files/abc``) or its ``data``. A file's ``size`` and ``sha256`` (hex) are what Gemini
    declared for it (``files.get``: ``sizeBytes``, ``sha256Hash``; None / "": not declared):
    a copy that differs is not archived."""

    key: str
    what: str
    file: str | None = None
    data: bytes | None = None
    size: int | None = None
    sha256: str = ""


@dataclass(frozen=True, slots=True)
class Outputs:
    """What a terminal operation left: nothing to copy when ``items`` is empty."""

    items: tuple[Output, ...] = ()
    expiration_ns: int = 0  # Gemini's expirationTime (the earliest), 0: not given
    requests: int | None = None  # a batch's batchStats.requestCount
    filtered_count: int | None = None  # videos removed by content filters
    filtered_reasons: tuple[str, ...] = field(default=())


class Source(Protocol):
    """What the archiver needs from Gemini."""

    def outputs(self, record: OpRecord) -> Outputs:
        """The results of the terminal operation ``record``. Raises ``SourceError``."""
        ...

    def download(self, file: str, writer: Writer) -> None:
        """Stream the bytes of Gemini file ``file`` (``files/abc``) into ``writer``.
        Raises ``SourceError`` (a cut connection included: ``transient``)."""
        ...
