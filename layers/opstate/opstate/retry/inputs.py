"""A batch's input, kept where retries can read it: checked, copied into the results sink under
its sha256, and read back by key (I/O, but no Gemini).

An input is JSON Lines, one request a line: ``{"key": "...", "request": {...}}``. ``check_input``
refuses (``InputError``, naming the line) a line that is not UTF-8, not JSON, not an object,
longer than the cap, without a text ``key`` (1..``MAX_KEY_CHARS`` characters) or a ``request``
object, a key seen before, and a blank line (a last newline is fine). A line is read as a
retry pass reads it (``opstate.retry.reading``: only its ``key`` and its ``request``'s shape
are built; a lone surrogate escape, ``NaN`` or ``Infinity`` anywhere is "not JSON"). It holds
each key's 8-byte digest, never a key's text nor a line: a repeated key is found once every
line is read (the digests sorted), and named by reading its line again when the source can be
read again; a line that is wrong otherwise is named as it is met.

A source that cannot be read is an ``InputError`` when reading again will not help (a local
file that is not there or not readable, an S3 object that does not exist or is refused) and a
transient ``SinkError`` otherwise (an S3 5xx, no answer).

``keep_input`` reads the source twice: once to check it, once to copy it into the sink at
``inputs/<sha256>/input.jsonl``; a source whose bytes changed between the two passes is refused
and nothing is left in the sink. An object already at that key is reused only when its own
bytes, read and hashed, have that sha256 (issue 38: neither S3's metadata nor a file's size is
trusted; whoever can write under the results location could have planted it); otherwise it
is written again from the source.

``verified`` passes a kept object's chunks through while hashing them and raises
``IntegrityError`` at its end when they do not have the sha256 recorded for them, before the
last chunk is handed on: an upload fed from it never finalizes with bytes opstate did not
check.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Container, Iterable, Iterator, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from opstate.outcomes.sink import Sink, SinkError
from opstate.retry.reading import (
    BadLineError,
    KeyIndex,
    digest,
    distinct,
    input_line,
    key_of,
    repeated,
    sorted_digests,
    utf8_error,
)
from opstate.retry.rules import LineTooLongError, lines

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MAX_KEY_CHARS = 512
CHUNK = 1024 * 1024
INPUTS_PREFIX = "inputs"
INPUT_NAME = "input.jsonl"
SOURCE_FORMS = "file:///ABS/PATH or s3://BUCKET/KEY"


type Chunks = Iterable[bytes] | Callable[[], Iterable[bytes]]


def _stream(chunks: Chunks) -> Iterable[bytes]:
    return chunks() if callable(chunks) else chunks


class InputError(ValueError):
    """A batch input that cannot be kept (``line``: 1-based, None for the whole file)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message if line is None else f"input line {line}: {message}")
        self.line = line


class IntegrityError(InputError):
    """A kept input (or a child's input) whose bytes no longer have their recorded sha256."""


def verified(chunks: Iterable[bytes], sha256: str | None, what: str) -> Iterator[bytes]:
    """``chunks`` passed through, hashed; ``IntegrityError`` (naming ``what``) once they end
    when their sha256 is not ``sha256`` (None: nothing recorded to check against, passed as
    they are: a plan written by the previous release)."""
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
        yield chunk
    if sha256 is not None and digest.hexdigest() != sha256:
        raise IntegrityError(
            f"{what} no longer has its recorded sha256 {sha256[:16]}... ({size} bytes read): "
            "it was changed or replaced after opstate kept it; nothing is sent from it"
        )


def held_intact(sink: Sink, location: str, sha256: str) -> bool:
    """Whether the object at ``location`` has bytes whose sha256 is ``sha256`` (read whole)."""
    try:
        for _ in verified(sink.chunks(location), sha256, location):
            pass
    except IntegrityError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class InputFacts:
    """A checked input: its rows, size and sha256."""

    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class KeptInput:
    """The kept copy of an input: its URI in the sink, sha256, rows and size."""

    location: str
    sha256: str
    rows: int
    bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "sha256": self.sha256,
            "rows": self.rows,
            "bytes": self.bytes,
        }


class _Hashing:
    """A chunk stream passed through, its bytes counted and hashed."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = chunks
        self.size = 0
        self.hash = hashlib.sha256()

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.size += len(chunk)
            self.hash.update(chunk)
            yield chunk


def _check_line(line: bytes, number: int) -> str:
    """The key of an input line (``InputError`` for anything but a request), read as the
    retry pass reads lines (``opstate.retry.reading``: the ``key`` and the ``request``'s shape,
    nothing else built)."""
    bad = utf8_error(line)
    if bad is not None:
        raise InputError(f"not UTF-8 (byte {bad + 1})", number)
    try:
        found = input_line(line)
    except BadLineError as exc:
        if exc.json_error:
            raise InputError(f"not JSON ({exc})", number) from None
        raise InputError("not a JSON object", number) from None
    key = found.key
    if not key:
        raise InputError('no "key" (a non-empty string)', number)
    if len(key) > MAX_KEY_CHARS:
        raise InputError(f'"key" is longer than {MAX_KEY_CHARS} characters', number)
    if not found.request_object:
        raise InputError('no "request" object', number)
    return key


def check_input(chunks: Chunks, max_line_bytes: int) -> InputFacts:
    """Check every line of an input (module doc); its facts, or ``InputError``. ``chunks``: a
    chunk stream, or a callable giving one (then a repeated key is named: it is read again)."""
    hashing = _Hashing(_stream(chunks))
    digests: array[int] = array("Q")
    number = 0
    try:
        # lines() gives no empty last line for a final newline: every blank one is refused
        for line in lines(hashing, max_line_bytes):
            number += 1
            if not line or line.isspace():
                raise InputError("blank line", number)
            digests.append(digest(_check_line(line, number)))
    except LineTooLongError as exc:
        raise InputError(f"longer than {max_line_bytes} bytes", exc.line) from None
    if not digests:
        raise InputError("the input holds no request")
    twice = repeated(sorted_digests(digests))
    if twice:
        number = _first_repeat(digests, twice)
        key = _key_at(chunks, number, max_line_bytes) if callable(chunks) else None
        said = f"key {key[:80]!r}" if key is not None else "its key"
        raise InputError(f"{said} was seen on an earlier line", number)
    return InputFacts(len(digests), hashing.size, hashing.hash.hexdigest())


def _first_repeat(digests: array[int], twice: Set[int]) -> int:
    """The 1-based line of the first key seen on an earlier line (every line holds a key)."""
    seen: set[int] = set()
    for index, value in enumerate(digests):
        if value in twice:
            if value in seen:
                return index + 1
            seen.add(value)
    raise AssertionError("no repeated key")  # pragma: no cover - twice names one


def _key_at(chunks: Callable[[], Iterable[bytes]], number: int, max_line_bytes: int) -> str | None:
    for at, line in enumerate(lines(chunks(), max_line_bytes, skip_long=True), start=1):
        if at == number:
            return key_of(line)
    return None  # pragma: no cover - the input changed under the check


def _file_chunks(path: str) -> Iterator[bytes]:
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below, after the last chunk
    except OSError as exc:  # not there, not a file, not readable by this process
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        while chunk := handle.read(CHUNK):
            yield chunk


# S3 error codes that name the object or its permission: reading again will not help.
_S3_REFUSALS = frozenset(
    {"NoSuchKey", "NoSuchBucket", "AccessDenied", "InvalidObjectState", "403", "404"}
)


def _s3_chunks(bucket: str, key: str, client: S3Client | None) -> Iterator[bytes]:
    from botocore.exceptions import BotoCoreError, ClientError

    if client is None:
        import boto3

        client = boto3.session.Session().client("s3")
    try:
        answer = client.get_object(Bucket=bucket, Key=key)
        body = answer["Body"]
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _S3_REFUSALS:
            raise InputError(f"cannot read s3://{bucket}/{key}: {code}") from None
        raise SinkError(f"reading s3://{bucket}/{key} failed: {code or exc}") from None
    except BotoCoreError as exc:  # no answer (endpoint, timeout, credentials): try again later
        raise SinkError(f"reading s3://{bucket}/{key} failed: {exc}") from None


def source_chunks(uri: str, *, client: S3Client | None = None) -> Callable[[], Iterator[bytes]]:
    """A callable streaming the object ``uri`` names, afresh on every call: ``file:///ABS``
    (a local file) or ``s3://BUCKET/KEY`` (``client``: an S3 client, else boto3's default).
    ``ValueError`` for any other URI."""
    parts = urlsplit(uri)
    if parts.scheme == "file" and parts.netloc in ("", "localhost") and parts.path.startswith("/"):
        path = unquote(parts.path)
        return lambda: _file_chunks(path)
    if parts.scheme == "s3" and parts.netloc and parts.path.strip("/"):
        bucket, key = parts.netloc, unquote(parts.path[1:])
        return lambda: _s3_chunks(bucket, key, client)
    raise ValueError(f"invalid input URI {uri!r}: expected {SOURCE_FORMS}")


def input_key(sha256: str) -> str:
    """The sink key of the kept input whose bytes have this sha256."""
    return f"{INPUTS_PREFIX}/{sha256}/{INPUT_NAME}"


def keep_input(
    chunks_fn: Callable[[], Iterable[bytes]],
    sink: Sink,
    max_line_bytes: int,
    *,
    name: str = "",
    reuse: bool = True,
) -> KeptInput:
    """Check the input (pass 1), then copy it into ``sink`` at ``input_key(sha256)`` (pass 2)
    unless an object is already there (module doc). ``name``: the operation it belongs to
    (the object's metadata). ``reuse=False``: never read what is there, write it again (the
    submit function, whose role may not read kept inputs). ``InputError`` when the input is
    bad or changed between passes (nothing written); ``SinkError`` when the storage fails."""
    facts = check_input(chunks_fn, max_line_bytes)
    key = input_key(facts.sha256)
    existing = sink.head(key) if reuse else None
    if (
        existing is not None
        and existing.size == facts.bytes
        and held_intact(sink, existing.location, facts.sha256)
    ):
        return KeptInput(existing.location, facts.sha256, facts.rows, facts.bytes)
    with sink.open(key, name=name or key, sha256=facts.sha256) as out:
        hashing = _Hashing(chunks_fn())
        for chunk in hashing:
            out.write(chunk)
            if hashing.size > facts.bytes:
                break
        if hashing.size != facts.bytes or hashing.hash.hexdigest() != facts.sha256:
            raise InputError("the input changed while it was being kept; nothing was kept")
        stored = out.commit(facts.sha256)
    return KeptInput(stored.location, facts.sha256, facts.rows, facts.bytes)


def subset(
    input_chunks: Iterable[bytes], keys: Container[str], max_line_bytes: int
) -> Iterator[tuple[str, bytes]]:
    """(key, line) of each line of a kept input whose key is in ``keys``, in input order; the
    line's bytes as they are, without the newline."""
    for line in lines(input_chunks, max_line_bytes, skip_long=True):
        key = key_of(line)
        if key is not None and key in keys:
            yield key, line


def keys_cover(input_chunks: Chunks, output_chunks: Chunks, max_line_bytes: int) -> int:
    """How many distinct keys of an output its input lacks (0: the input covers it). Each
    side is a chunk stream, or a callable giving one. Holds the input's keys as digests
    (``reading.KeyIndex``) and the lacking ones as digests too, never a key's text."""
    index = KeyIndex(
        key
        for line in lines(_stream(input_chunks), max_line_bytes, skip_long=True)
        if (key := key_of(line)) is not None
    )
    lacking: array[int] = array("Q")
    for line in lines(_stream(output_chunks), max_line_bytes, skip_long=True):
        key = key_of(line)
        if key is not None and index.slot_of(value := digest(key)) is None:
            lacking.append(value)
    return distinct(sorted_digests(lacking))
