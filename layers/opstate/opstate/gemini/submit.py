"""Submitting to the Gemini API: upload a JSONL input, create a batch from it, cancel one, read
one, and find the batches opstate created by the id carried in their display name.

- ``upload_jsonl``: the Files API's resumable upload (``client.files.upload``) of a path or of
  chunks with their size, handed to the SDK as a stream that yields at most
  ``UPLOAD_CHUNK_BYTES`` per read (the SDK sends each read as one ``upload`` command), so no
  more than one chunk is ever held; the file's name (``files/<id>``) comes back;
- ``create_batch``: ``client.batches.create(model, src=files/<id>, display_name)`` as the
  created name and its first event (``from_batch_job``); ``create_or_delete``: the same, the
  upload deleted (``files.delete``) when Gemini refuses the create;
- ``cancel_batch``, ``read_batch`` (the REST resource, as ``rest_batch`` reads it);
- ``find_by_input_file``: every batch of the REST listing whose input
  (``metadata.inputConfig.fileName``) is a given upload; ``find_by_display_id``: every batch
  whose ``displayName`` holds a marker as one of its space-separated words (a display name is
  public to the project: a hint only). The listing is only a hint: the caller reads each found
  job with ``read_batch`` before acting on it.

A failed request raises ``GatewayError`` (``classify``); ``create_refusal`` says what a refused
create means (``opstate.domain.refusals``): money (the lineage stops), passing or daily (it backs
off and is tried again), or other.
Bad arguments raise ``ValueError`` before anything is sent.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from opstate.domain.events import from_batch_job
from opstate.domain.model import OpEvent
from opstate.domain.refusals import Verdict, refusal_of
from opstate.gemini.batches import input_file_of, rest_batch, rest_listing_tokens, rest_resource
from opstate.gemini.errors import GatewayError, classify
from opstate.gemini.files import is_file_name
from opstate.gemini.port import GeminiClient

# Bytes per ``upload`` command: a multiple of 256 KiB (the resumable protocol's granularity for
# every chunk but the last); the SDK would read 8 MiB at a time from a plain file.
UPLOAD_CHUNK_BYTES = 2 * 1024 * 1024
# The MIME type Gemini's batch mode documents for a JSONL input file.
JSONL_MIME_TYPE = "jsonl"


class _ChunkReader(io.RawIOBase):
    """A JSONL input as the binary stream ``files.upload`` takes: reads return at most
    ``UPLOAD_CHUNK_BYTES``; ``seek``/``tell`` only answer the SDK's size probe (to the end and
    back); a source shorter or longer than ``size`` raises ``ValueError`` instead of letting a
    wrong upload finalize."""

    def __init__(self, pieces: Iterator[bytes], size: int) -> None:
        super().__init__()
        self._pieces = pieces
        self._size = size
        self._read = 0  # bytes handed out
        self._at = 0  # where the SDK believes the stream is
        self._rest = b""  # what the last piece held beyond the last read

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        target = {os.SEEK_SET: offset, os.SEEK_END: self._size + offset}.get(whence)
        if target is None or target not in (self._read, self._size):
            raise io.UnsupportedOperation("an upload stream only seeks to its end and back")
        self._at = target
        return target

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._take(min(len(view), UPLOAD_CHUNK_BYTES))
        view[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        limit = UPLOAD_CHUNK_BYTES if size is None or size < 0 else min(size, UPLOAD_CHUNK_BYTES)
        return self._take(limit)

    def _take(self, limit: int) -> bytes:
        """Up to ``limit`` bytes: a piece as it came when it fits (no copy), else joined."""
        if self._at != self._read:
            raise io.UnsupportedOperation("read after a seek away from the read position")
        parts: list[bytes] = []
        got = 0
        ended = False
        while got < limit:
            piece = self._rest or next(self._pieces, None)
            self._rest = b""
            if piece is None:
                ended = True
                break
            if len(piece) > limit - got:
                piece, self._rest = piece[: limit - got], piece[limit - got :]
            parts.append(piece)
            got += len(piece)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        del parts
        self._read += len(data)
        self._at = self._read
        if self._read > self._size:
            raise ValueError(f"the upload source holds more than its declared {self._size} bytes")
        if ended and self._read < self._size:  # before the SDK sends a short chunk
            raise ValueError(
                f"the upload source ended after {self._read} of its declared {self._size} bytes"
            )
        if self._read == self._size and (self._rest or next(self._pieces, b"")):
            raise ValueError(f"the upload source holds more than its declared {self._size} bytes")
        return data


def _file_pieces(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while piece := handle.read(UPLOAD_CHUNK_BYTES):
            yield piece


def _nonempty(pieces: Iterable[bytes]) -> Iterator[bytes]:
    for piece in pieces:
        if not isinstance(piece, bytes | bytearray | memoryview):
            raise ValueError(f"upload chunks must be bytes, not {type(piece).__name__}")
        if piece:
            yield bytes(piece)


def upload_jsonl(
    client: GeminiClient,
    path: Path | None = None,
    *,
    chunks: Iterable[bytes] | None = None,
    size: int | None = None,
    display_name: str,
) -> str:
    """Upload a JSONL input (``path``, or ``chunks`` totalling ``size`` bytes) with the Files
    API's resumable upload; returns the file's name (``files/<id>``). Never holds the whole
    input: the SDK is handed a stream yielding at most ``UPLOAD_CHUNK_BYTES`` per read."""
    if (path is None) == (chunks is None):
        raise ValueError("upload_jsonl takes either a path or chunks, not both or neither")
    if not display_name.strip():
        raise ValueError("an upload needs a display name")
    if path is not None:
        if not path.is_file():
            raise ValueError(f"{path} is not a file")
        total = path.stat().st_size
        pieces: Iterator[bytes] = _file_pieces(path)
    else:
        if size is None or isinstance(size, bool) or size < 0:
            raise ValueError("chunks need their total size (a non-negative integer)")
        total = size
        pieces = _nonempty(chunks or ())
    if total == 0:
        raise ValueError("an empty input has nothing to submit")
    stream = _ChunkReader(pieces, total)
    try:
        uploaded = client.files.upload(
            file=stream, config={"mime_type": JSONL_MIME_TYPE, "display_name": display_name}
        )
    except ValueError:
        raise
    except Exception as exc:
        raise classify(exc) from exc
    finally:
        stream.close()
    name = getattr(uploaded, "name", None)
    if not isinstance(name, str) or not is_file_name(name):
        raise GatewayError(f"the upload answered no usable file name: {name!r}")
    return name


def create_batch(client: GeminiClient, model: str, file_name: str, display_name: str) -> OpEvent:
    """Create a batch of ``model`` over the uploaded ``file_name`` (``batches.create``): the
    event its answer makes (its ``name`` is the batch's, ``batches/<id>``)."""
    if not model.strip():
        raise ValueError("a batch needs a model")
    if not is_file_name(file_name):
        raise ValueError(f"not a Gemini file name: {file_name!r}")
    if not display_name.strip():
        raise ValueError("a batch needs a display name")
    try:
        job = client.batches.create(
            model=model, src=file_name, config={"display_name": display_name}
        )
    except Exception as exc:
        raise classify(exc) from exc
    return from_batch_job(job)


def create_or_delete(
    client: GeminiClient, model: str, file_name: str, display_name: str
) -> OpEvent:
    """``create_batch``; when Gemini refuses it with a definite answer (a 4xx: no batch was
    made), the uploaded ``file_name`` is deleted (``files.delete``, best effort) before the
    refusal is raised, so a failed create leaves no upload behind. A timeout or a 5xx may
    have created the batch: its input is kept (the batch would fail without it)."""
    try:
        return create_batch(client, model, file_name, display_name)
    except GatewayError as exc:
        if exc.status is not None and 400 <= exc.status < 500:
            delete_file(client, file_name)
        raise


def delete_file(client: GeminiClient, name: str) -> bool:
    """Delete the uploaded file ``name`` (``files.delete``); False when it could not be (a
    404 counts as deleted: Gemini no longer holds it)."""
    try:
        client.files.delete(name=name)
    except Exception as exc:
        return classify(exc).status == 404
    return True


def cancel_batch(client: GeminiClient, name: str) -> None:
    """Ask Gemini to cancel batch ``name`` (``batches.cancel``)."""
    try:
        client.batches.cancel(name=name)
    except ValueError:
        raise
    except Exception as exc:
        raise classify(exc) from exc


def read_batch(client: GeminiClient, name: str) -> OpEvent:
    """Batch ``name`` as its REST resource says now (``rest_batch``: with its batchStats)."""
    try:
        return rest_batch(client, name)
    except Exception as exc:
        if type(exc).__module__.startswith("opstate."):
            raise
        raise classify(exc) from exc


# The display-name search reads at most this many pages (``MAX_SEARCH_PAGES`` x its page size
# jobs, newest first as Gemini lists them) before it gives up (``SearchCutError``).
MAX_SEARCH_PAGES = 100


class SearchCutError(GatewayError):
    """The display-name search stopped before the listing's end (its page cap, a next-page
    token the listing gave before, or the caller's time): whether the job is there is not
    known, so nothing may be created on it (transient: a later search may finish)."""

    def __init__(self, marker: str, why: str) -> None:
        super().__init__(
            f"the search for {marker} stopped before the listing's end ({why}); nothing created",
            transient=True,
        )
        self.why = why


def find_by_display_id(
    client: GeminiClient,
    marker: str,
    page_size: int = 100,
    *,
    max_pages: int = MAX_SEARCH_PAGES,
    time_left: Callable[[], float] | None = None,
) -> list[str]:
    """Names of the batches whose ``displayName`` holds ``marker`` as one of its space-separated
    words (``"<cut name> <id>"`` or ``"<id>"``: id ``...-a1-1`` never finds ``...-a1-10``), over
    every page of the REST listing (``GET batches?pageSize&pageToken``), in listing order. Any
    job counts, even one whose state this release does not know; read each with ``read_batch``
    before acting. A display name is public to every key of the project: what is found this
    way is a hint, never evidence.

    Bounded: after ``max_pages`` pages, on a next-page token the listing gave before (a listing
    that never ends) and once ``time_left()`` (seconds) is at or below 0 before a page, the
    search raises ``SearchCutError`` instead of answering: an unfinished search never reads as
    "not there"."""
    if not marker or marker.split() != [marker]:
        raise ValueError(f"a marker is one word, not {marker!r}")
    return _search(
        client,
        marker,
        lambda item: marker in _named(item)[1].split(),
        page_size,
        max_pages=max_pages,
        time_left=time_left,
    )


def find_by_input_file(
    client: GeminiClient,
    file_name: str,
    page_size: int = 100,
    *,
    max_pages: int = MAX_SEARCH_PAGES,
    time_left: Callable[[], float] | None = None,
) -> list[str]:
    """Names of the batches whose input is the uploaded file ``file_name``
    (``metadata.inputConfig.fileName`` of each listed batch), bounded as
    ``find_by_display_id`` is. The listing is a hint: read each job before acting on it."""
    if not is_file_name(file_name):
        raise ValueError(f"not a Gemini file name: {file_name!r}")
    return _search(
        client,
        file_name,
        lambda item: input_file_of(item) == file_name,
        page_size,
        max_pages=max_pages,
        time_left=time_left,
    )


def _search(
    client: GeminiClient,
    what: str,
    matches: Callable[[object], bool],
    page_size: int,
    *,
    max_pages: int,
    time_left: Callable[[], float] | None,
) -> list[str]:
    """Names of the listed batches ``matches`` accepts, every page read (bounded: see
    ``find_by_display_id``)."""
    if isinstance(page_size, bool) or not 1 <= page_size <= 1000:
        raise ValueError(f"page_size must be 1..1000, not {page_size!r}")
    if isinstance(max_pages, bool) or max_pages < 1:
        raise ValueError(f"max_pages must be >= 1, not {max_pages!r}")
    found: list[str] = []
    tokens: set[str] = set()
    for pages, (page, token) in enumerate(rest_listing_tokens(client, page_size), start=1):
        found.extend(name for item in page if (name := _named(item)[0]) and matches(item))
        if token is None:
            return found
        _check_search(what, token in tokens, pages >= max_pages, time_left)
        tokens.add(token)
    return found  # pragma: no cover - rest_listing_tokens ends with a None token


def _check_search(
    marker: str, repeated: bool, capped: bool, time_left: Callable[[], float] | None
) -> None:
    """``SearchCutError`` when the display-name search must stop before its next page."""
    if repeated:
        raise SearchCutError(marker, "the listing repeated a next-page token")
    if capped:
        raise SearchCutError(marker, "its page cap was read")
    if time_left is not None and time_left() <= 0:
        raise SearchCutError(marker, "the pass ran out of time")


def _named(item: object) -> tuple[str, str]:
    """(name, displayName) of one listed batch (an LRO whose ``metadata`` is the batch)."""
    if not isinstance(item, Mapping):
        return "", ""
    metadata = item.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name = item.get("name") or metadata.get("name")
    display = metadata.get("displayName")
    return (
        name if isinstance(name, str) else "",
        display if isinstance(display, str) else "",
    )


def create_refusal(exc: BaseException) -> Verdict:
    """What a refused create means for a retry (``opstate.domain.refusals.refusal_of`` of its
    HTTP status, status name, message and details): ``MONEY`` (402, billing, prepayment, a
    spending cap: refused again until a person acts, the lineage stops), ``PASSING`` (a rate
    limit or a full batch queue; with the delay Gemini asked for), ``DAILY`` (a per-day quota,
    back at midnight Pacific) or ``OTHER``."""
    error = classify(exc)
    return refusal_of(error.status, error.rpc_status, error.said or error.message, error.details)


def inlined_requests(client: GeminiClient, name: str) -> list[bytes] | None:
    """The input of batch ``name`` when it was created with inlined requests, as JSONL lines
    ``{"key", "request"}`` (from its REST resource: ``metadata.inputConfig.requests.requests``,
    each ``{"request", "metadata": {"key"}}``); None when the resource holds none (a file input,
    which Gemini never gives back) or any request lacks a key (its rows could not be matched)."""
    metadata = batch_metadata(client, name)
    config = metadata.get("inputConfig")
    inlined = config.get("requests") if isinstance(config, Mapping) else None
    items = inlined.get("requests") if isinstance(inlined, Mapping) else None
    if not isinstance(items, list) or not items:
        return None
    lines = []
    for item in items:
        request = item.get("request") if isinstance(item, Mapping) else None
        meta = item.get("metadata") if isinstance(item, Mapping) else None
        key = meta.get("key") if isinstance(meta, Mapping) else None
        if not isinstance(key, str) or not key or not isinstance(request, Mapping):
            return None
        lines.append(json.dumps({"key": key, "request": request}, separators=(",", ":")).encode())
    return lines


def batch_metadata(client: GeminiClient, name: str) -> Mapping[str, Any]:
    """The ``metadata`` (the batch itself) of batch ``name``'s REST resource; {} when it has
    none. A failure as ``classify`` says."""
    try:
        body = rest_resource(client, name)
    except Exception as exc:
        raise classify(exc) from exc
    metadata = body.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def batch_model(client: GeminiClient, name: str) -> str:
    """The model batch ``name`` runs on (``metadata.model``): a batch tracked with ``--input``
    was created elsewhere, its retries use the same model."""
    model = batch_metadata(client, name).get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(f"Gemini does not say which model {name} used", transient=False)
    return model
