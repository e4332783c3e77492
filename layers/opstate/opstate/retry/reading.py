"""Reading a lineage's lines with bounded memory (pure: bytes in, keys and rows out; no I/O).

A retry pass reads inputs and outputs whose lines may each be up to the line cap (32 MiB) and
whose keys may number millions. ``json.loads`` of a whole line builds every value in it (a
32 MiB line of small parts is ~600 MiB of objects), and a set of every key holds every key's
text. Here, as the archiver's ledger does (``opstate.outcomes.ledger_rows``), a line goes
through msgspec into structs of only the fields a retry uses, every other field skipped
unbuilt:

- ``key_of`` / ``input_line``: the ``key`` of an input line (and, to check one, whether its
  ``request`` is an object);
- ``read_output``: an output row as ``rules.Row`` needs it: its ``key``, its ``response``
  (read in full when it is at most ``SMALL_BYTES``; a larger one only by the fields that say
  whether it is blocked: ``promptFeedback.blockReason`` and each candidate's
  ``finishReason``; a candidate larger than ``SMALL_BYTES`` is one that has content), its
  ``status``/``error`` (at most ``SMALL_BYTES`` in full, else its ``code``, ``status`` and
  ``message``) and the line's own bytes.

Output rows are read **strictly**: a line that is not UTF-8, not JSON (``NaN``,
``Infinity``), holds a lone surrogate escape (``"\\ud800"``) anywhere, or is not an object is
unreadable (None). A number too large for a float (``1e400``) is valid JSON text and is kept
as written (a row's bytes are copied, never re-serialised: ``final_line``).

``KeyIndex``: the keys of an input as sorted 8-byte blake2b digests in an ``array`` (8 bytes a
key, 16 while it is built), with a slot per key for the callers' own arrays; never the keys'
text. Two distinct keys share a digest with probability about n^2 / 2^65 (3e-8 for 10^6 keys);
the input check then refuses the input as holding a repeated key.

Without msgspec (it comes with the ``gemini`` extra every retry pass needs) each line is read
with ``json.loads`` instead: the same answers, without the memory bound.
"""

from __future__ import annotations

import codecs
import hashlib
import heapq
import json
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

try:
    import msgspec

    HAVE_MSGSPEC = True
except ImportError:  # pragma: no cover - the gemini extra installs it
    HAVE_MSGSPEC = False

# A response, candidate or status at most this large is read in full (json.loads: a few MiB
# of objects at worst); a larger one only by the fields named in the module doc.
SMALL_BYTES = 1024 * 1024
# UTF-8 is checked in slices of this many bytes (a slice's text is freed before the next).
_UTF8_SLICE = 1024 * 1024
# Digests sorted in runs of this many (a run's list of ints freed before the next).
_SORT_RUN = 65_536
_JSON_SPACE = b" \t\r\n"


def utf8_error(data: bytes | bytearray | memoryview) -> int | None:
    """The offset of the first byte that is not UTF-8 in ``data``, or None when it all is;
    checked a slice at a time, so no copy of ``data`` as text is ever whole."""
    if not isinstance(data, memoryview) and data.isascii():
        return None
    view = memoryview(data)
    if view.nbytes <= _UTF8_SLICE:
        try:
            str(view, "utf-8")
        except UnicodeDecodeError as exc:
            return exc.start
        return None
    decoder = codecs.getincrementaldecoder("utf-8")()
    for start in range(0, view.nbytes, _UTF8_SLICE):
        piece = view[start : start + _UTF8_SLICE]
        try:
            decoder.decode(piece, final=start + _UTF8_SLICE >= view.nbytes)
        except UnicodeDecodeError as exc:
            return max(start + exc.start, 0)
    return None


def _is_utf8(line: bytes) -> bool:
    return line.isascii() or utf8_error(line) is None


if HAVE_MSGSPEC:
    _ABSENT = msgspec.Raw()

    class _Line(msgspec.Struct):
        """The top of a line: only the fields a retry reads, each left as its raw text."""

        key: msgspec.Raw = _ABSENT
        request: msgspec.Raw = _ABSENT
        response: msgspec.Raw = _ABSENT
        status: msgspec.Raw = _ABSENT
        error: msgspec.Raw = _ABSENT
        attempt: msgspec.Raw = _ABSENT

    class _Feedback(msgspec.Struct, rename="camel"):
        block_reason: msgspec.Raw = _ABSENT

    class _Response(msgspec.Struct, rename="camel"):
        prompt_feedback: msgspec.Raw = _ABSENT
        candidates: msgspec.Raw = _ABSENT

    class _Candidate(msgspec.Struct, rename="camel"):
        finish_reason: msgspec.Raw = _ABSENT

    class _Status(msgspec.Struct):
        code: msgspec.Raw = _ABSENT
        status: msgspec.Raw = _ABSENT
        message: msgspec.Raw = _ABSENT

    _decode_line = msgspec.json.Decoder(_Line).decode
    _decode_response = msgspec.json.Decoder(_Response).decode
    _decode_candidate = msgspec.json.Decoder(_Candidate).decode
    _decode_feedback = msgspec.json.Decoder(_Feedback).decode
    _decode_status = msgspec.json.Decoder(_Status).decode
    _decode_raws = msgspec.json.Decoder(list[msgspec.Raw]).decode
    _DECODE_ERRORS: tuple[type[Exception], ...] = (msgspec.MsgspecError, RecursionError)
    _READ_ERRORS: tuple[type[Exception], ...] = (*_DECODE_ERRORS, ValueError)


def _first(raw: Any) -> bytes:
    """The first byte of a raw JSON value (b"" when absent)."""
    return memoryview(raw)[:1].tobytes()


def _small(raw: Any) -> Any:
    """A raw JSON value of at most ``SMALL_BYTES``, built (``json.loads``)."""
    return json.loads(bytes(raw))


def _scalar(raw: Any) -> Any:
    """A raw value when it is a string, number, bool or null; any other as ``...`` (a value
    that is not one of those: the rules only ask whether it is a string)."""
    text = bytes(raw)
    if not text or text[:1] in (b"{", b"["):
        return ...
    return json.loads(text)


class BadLineError(ValueError):
    """A line that is not a JSON object: ``json`` (False: valid JSON but not an object)."""

    def __init__(self, message: str, *, json_error: bool) -> None:
        super().__init__(message)
        self.json_error = json_error


@dataclass(frozen=True, slots=True)
class InputLine:
    """What the input check needs of a line: its key (None: absent or not a string) and
    whether its ``request`` is an object."""

    key: str | None
    request_object: bool


def _raw_text(raw: Any) -> str | None:
    """The string a raw JSON value is, or None when it is not a string."""
    if _first(raw) != b'"':
        return None
    text: str = msgspec.json.decode(raw, type=str)
    return text


def input_line(line: bytes) -> InputLine:
    """The key and request shape of one line (``BadLineError`` when it is not JSON or not an
    object; UTF-8 is the caller's to check first)."""
    if not HAVE_MSGSPEC:  # pragma: no cover
        return _json_input_line(line)
    try:
        top = _decode_line(line)
    except msgspec.ValidationError:
        raise BadLineError("not a JSON object", json_error=False) from None
    except _DECODE_ERRORS as exc:
        raise BadLineError(str(exc), json_error=True) from None
    return InputLine(_raw_text(top.key), _first(top.request) == b"{")


def _json_input_line(line: bytes) -> InputLine:  # pragma: no cover - without msgspec
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        value = json.loads(line.decode("utf-8"), parse_constant=refuse)
    except (ValueError, RecursionError) as exc:
        raise BadLineError(str(exc), json_error=True) from None
    if not isinstance(value, dict):
        raise BadLineError("not a JSON object", json_error=False)
    key = value.get("key")
    return InputLine(key if isinstance(key, str) else None, isinstance(value.get("request"), dict))


def key_of(line: bytes) -> str | None:
    """The text ``key`` of a line that is a UTF-8 JSON object, else None."""
    if not line or line.isspace() or not _is_utf8(line):
        return None
    try:
        return input_line(line).key
    except BadLineError:
        return None


@dataclass(frozen=True, slots=True)
class OutputRow:
    """An output line read strictly: ``value`` holds what ``rules.row_of`` reads (``key``,
    ``response`` or ``status``/``error``; a large response only by its blocking fields),
    ``line`` the row's own bytes, ``attempt``: it has an ``attempt`` member of its own."""

    key: str | None
    value: dict[str, Any]
    line: bytes
    attempt: bool


def read_output(line: bytes) -> OutputRow | None:
    """An output line as ``OutputRow``; None when it is blank or unreadable (module doc)."""
    if not line or line.isspace() or not _is_utf8(line):
        return None
    if not HAVE_MSGSPEC:  # pragma: no cover
        return _json_output(line)
    try:
        top = _decode_line(line)
        key = _raw_text(top.key)
        value: dict[str, Any] = {} if key is None else {"key": key}
        if _first(top.response) == b"{":
            value["response"] = _response(top.response)
        for name in ("status", "error"):
            raw = getattr(top, name)
            if _first(raw) == b"{":
                value[name] = _status(raw)
    except _READ_ERRORS:
        return None
    return OutputRow(key, value, line, len(top.attempt) > 0)


def _json_output(line: bytes) -> OutputRow | None:  # pragma: no cover - without msgspec
    from opstate.domain.strict_json import InvalidJSONError, loads

    try:
        value = loads(line)
        text = json.dumps(value, ensure_ascii=False)
        text.encode("utf-8")  # a lone surrogate
    except (InvalidJSONError, UnicodeEncodeError):
        return None
    if not isinstance(value, dict):
        return None
    key = value.get("key")
    return OutputRow(key if isinstance(key, str) else None, value, line, "attempt" in value)


def _response(raw: Any) -> dict[str, Any]:
    if len(raw) <= SMALL_BYTES:
        value: dict[str, Any] = _small(raw)
        return value
    top = _decode_response(raw)
    thin: dict[str, Any] = {}
    if len(top.prompt_feedback):
        if _first(top.prompt_feedback) == b"{":
            feedback = _decode_feedback(top.prompt_feedback)
            reason = _scalar(feedback.block_reason) if len(feedback.block_reason) else None
            thin["promptFeedback"] = {} if reason is None else {"blockReason": reason}
        else:
            thin["promptFeedback"] = ...
    if len(top.candidates):
        if _first(top.candidates) == b"[":
            thin["candidates"] = [_candidate(c) for c in _decode_raws(top.candidates)]
        else:
            thin["candidates"] = _scalar(top.candidates)
    return thin


def _candidate(raw: Any) -> Any:
    if len(raw) <= SMALL_BYTES:
        return _small(raw)
    if _first(raw) != b"{":
        return ...
    found = _decode_candidate(raw)
    candidate: dict[str, Any] = {"content": {"parts": [{"text": "..."}]}}
    if len(found.finish_reason):
        candidate["finishReason"] = _scalar(found.finish_reason)
    return candidate


def _status(raw: Any) -> dict[str, Any]:
    if len(raw) <= SMALL_BYTES:
        value: dict[str, Any] = _small(raw)
        return value
    found = _decode_status(raw)
    return {
        name: _scalar(part)
        for name in ("code", "status", "message")
        if len(part := getattr(found, name))
    }


def final_line(row: OutputRow, attempt: int) -> Iterator[bytes]:
    """The row's own bytes with ``"attempt": n`` added as its last member, and a newline, in
    pieces of at most ``_UTF8_SLICE`` bytes (a sink writes them as they come: a 32 MiB row is
    never copied whole). A row that has an ``attempt`` of its own (never Gemini's) is
    re-serialised with it replaced; ``ValueError`` at once (before any piece) when such a row
    is larger than ``SMALL_BYTES``: the caller counts it unreadable."""
    view = memoryview(row.line)
    start, end = 0, len(view)
    while start < end and view[start] in _JSON_SPACE:
        start += 1
    while end > start and view[end - 1] in _JSON_SPACE:
        end -= 1
    if row.attempt:
        if end - start > SMALL_BYTES:
            raise ValueError("a large row with an attempt of its own")
        from opstate.domain.strict_json import dumps, loads

        value = loads(bytes(view[start:end]))
        value["attempt"] = attempt
        return iter((dumps(value, compact=True).encode("utf-8") + b"\n",))
    return _pieces(view, start, end - 1, b',"attempt":%d}\n' % attempt)


def _pieces(view: memoryview, start: int, stop: int, tail: bytes) -> Iterator[bytes]:
    for at in range(start, stop, _UTF8_SLICE):
        yield bytes(view[at : min(at + _UTF8_SLICE, stop)])
    yield tail


# -- key digests ----------------------------------------------------------------------------


def digest(key: str) -> int:
    """A key's 8-byte blake2b digest, as an int."""
    data = key.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def sorted_digests(values: array[int]) -> array[int]:
    """``values`` (an ``array("Q")``) sorted, in runs of ``_SORT_RUN`` merged, so at most one
    run is ever a list of ints."""
    runs = [array("Q", sorted(values[i : i + _SORT_RUN])) for i in range(0, len(values), _SORT_RUN)]
    merged = array("Q")
    merged.extend(heapq.merge(*runs))
    return merged


def repeated(ordered: array[int]) -> set[int]:
    """The values that occur more than once in a sorted array."""
    return {ordered[i] for i in range(1, len(ordered)) if ordered[i] == ordered[i - 1]}


def distinct(ordered: array[int]) -> int:
    """How many different values a sorted array holds."""
    return sum(1 for i in range(len(ordered)) if i == 0 or ordered[i] != ordered[i - 1])


class KeyIndex:
    """The distinct keys of a stream as sorted digests: ``slot(key)`` is a key's position
    (0..len-1), or None for a key it does not hold."""

    def __init__(self, keys: Iterable[str]) -> None:
        digests = array("Q", map(digest, keys))
        ordered = sorted_digests(digests)
        del digests
        unique = array("Q")
        unique.extend(
            ordered[i] for i in range(len(ordered)) if i == 0 or ordered[i] != ordered[i - 1]
        )
        self._digests = unique

    def __len__(self) -> int:
        return len(self._digests)

    def slot(self, key: str) -> int | None:
        return self.slot_of(digest(key))

    def slot_of(self, value: int) -> int | None:
        digests = self._digests
        index = bisect_left(digests, value)
        if index < len(digests) and digests[index] == value:
            return index
        return None


def output_rows(lines: Iterable[bytes]) -> Iterator[tuple[int, OutputRow | None]]:
    """(line number, ``read_output``) of each non-blank line."""
    for number, line in enumerate(lines):
        if line and not line.isspace():
            yield number, read_output(line)
