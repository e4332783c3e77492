"""Copying one object: its bytes streamed from Gemini through its ledger into the sink, and
compared with what Gemini declared before the object is committed.

A download that ends early without an error (a close-delimited body cut short, a body shorter
than ``files.get``'s ``sizeBytes``) or whose sha256 is not Gemini's ``sha256Hash`` raises
``CopyError`` inside the sink's ``with`` block, so nothing is left under the key: the entry
is ``failed`` and copied again on a later pass.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from typing import Any

from opstate.outcomes.ledger import BatchLedger, VideoLedger
from opstate.outcomes.sink import Sink, SinkError, StoredObject
from opstate.outcomes.source import BATCH_OUTPUT, Output, Source

# Chunks (1 MiB each from the SDK) queued between the download and the writing thread.
WRITE_QUEUE_CHUNKS = 8

Ledger = BatchLedger | VideoLedger


class CopyError(Exception):
    """A copy that is not the object Gemini declared (or cannot be archived at all)."""


class Tee:
    """Sends every chunk of a download through the ledger into the sink's writer, on two
    threads: this one (the download's) counts the lines, which holds the interpreter; a thread
    of its own writes each chunk to the sink and hashes it, which mostly does not (file writes
    and hashlib let go of the interpreter), so the copy, the count and the digest run side by
    side on two cores. The queue between them is bounded: memory stays bounded. A failure of
    the writer (a ``SinkError``; anything else it raises becomes one) stops the download at its
    next chunk, or is raised by ``close`` when no chunk came after it."""

    def __init__(self, ledger: Ledger, out: Any) -> None:
        self.ledger = ledger
        self.count = ledger.count if isinstance(ledger, BatchLedger) else None
        self.out = out
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize=WRITE_QUEUE_CHUNKS)
        self.error: SinkError | None = None
        self.reported = False
        self.thread = threading.Thread(target=self._write, name="archive-write", daemon=True)
        self.thread.start()

    def _write(self) -> None:
        while (chunk := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.out.write(chunk)
                    self.ledger.digest(chunk)
                except SinkError as exc:  # raised by the next write() or by close()
                    self.error = exc
                except Exception as exc:
                    self.error = SinkError(f"writing the copy failed: {type(exc).__name__}: {exc}")
                    self.error.__cause__ = exc

    def write(self, data: bytes) -> int:
        if self.error is not None:
            self.reported = True
            raise self.error
        chunk = bytes(data)
        self.queue.put(chunk)
        if self.count is not None:
            self.count(chunk)
        return len(chunk)

    def close(self) -> None:
        """Wait until every chunk is written and digested; raise what the writer raised,
        unless a write() already did (the download failed with it)."""
        self.queue.put(None)
        self.thread.join()
        if self.error is not None and not self.reported:
            raise self.error


def new_ledger(item: Output, max_line_bytes: int) -> Ledger:
    """The ledger of ``item``: a batch output's rows, or only the bytes and sha256."""
    if item.what == BATCH_OUTPUT:
        return BatchLedger(max_line_bytes=max_line_bytes)
    return VideoLedger()


def declared(item: Output) -> tuple[int | None, str]:
    """The size and sha256 (hex, "" when unknown) the copy of ``item`` must have: Gemini's
    for a file, the bytes' own for data in hand."""
    if item.data is not None:
        return len(item.data), hashlib.sha256(item.data).hexdigest()
    return item.size, item.sha256


def mismatch(item: Output, size: int, sha256: str) -> str | None:
    """Why a copy of ``size`` bytes with ``sha256`` is not ``item`` (None: it is)."""
    want_size, want_sha256 = declared(item)
    what = item.file or item.key
    if want_size is not None and size != want_size:
        return f"the copy of {what} is {size} bytes, Gemini declared {want_size}"
    if want_sha256 and sha256 != want_sha256:
        return f"the copy of {what} has sha256 {sha256}, Gemini declared {want_sha256}"
    return None


def copy_object(
    source: Source, sink: Sink, key: str, name: str, item: Output, max_line_bytes: int
) -> tuple[StoredObject, Ledger]:
    """Stream ``item`` into the sink under ``key`` through its ledger; commit it only when it
    is what Gemini declared (else ``CopyError``, nothing left under ``key``)."""
    ledger = new_ledger(item, max_line_bytes)
    with sink.open(key, name=name, sha256=declared(item)[1]) as out:
        tee = Tee(ledger, out)
        try:
            if item.file is not None:
                source.download(item.file, tee)
            elif item.data is not None:
                tee.write(item.data)
        finally:
            tee.close()
        if isinstance(ledger, BatchLedger):
            ledger.finish()
        wrong = mismatch(item, ledger.size, ledger.sha256) if item.file is not None else None
        if wrong is not None:
            raise CopyError(wrong)
        stored = out.commit(ledger.sha256)
    return stored, ledger
