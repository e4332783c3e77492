"""The ledger: what a batch's output held, computed while it streams past (pure: bytes in,
counts out, no I/O).

A batch output is JSON Lines, one line per request: ``{"key", "response": {...}}`` for a
request that succeeded, ``{"key", "status"|"error": {"code", "message"}}`` (a
``google.rpc.Status``) for one that failed. ``BatchLedger.feed`` takes the bytes in whatever
chunks they arrive (a line may be cut anywhere, even inside a UTF-8 sequence) and keeps only the
unfinished last line between calls, so memory is bounded by the longest line, never the file:

- rows: ``total`` (non-blank lines), ``succeeded`` (a line with a ``response`` object),
  ``failed`` (a line with a ``status`` or ``error`` object and no ``response``), ``unreadable``
  (anything else: not JSON, not an object, neither shape);
- ``errors``: failed rows by their error ``code`` (``"unknown"`` when it has none);
- ``usage``: the sum over succeeded rows of ``response.usageMetadata``'s six token counts
  (``USAGE_FIELDS``; a missing or non-integer field counts 0);
- ``size`` (bytes) and ``sha256`` of everything fed.

``VideoLedger`` is the same for one video (bytes and sha256 only).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

USAGE_FIELDS = (
    "promptTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
    "cachedContentTokenCount",
    "toolUsePromptTokenCount",
    "totalTokenCount",
)
UNKNOWN_CODE = "unknown"
# One decoder, bound once: json.loads would re-check its arguments and sniff the encoding of
# bytes on every line.
_decoder = json.JSONDecoder()
_decode = _decoder.decode
# The scanner decode runs (the C one when there is one): (value, end index) of the JSON value
# at an index of a text.
_scan_once: Callable[[str, int], tuple[Any, int]] = _decoder.scan_once  # type: ignore[attr-defined]


def _count(value: object) -> int:
    """A token count as JSON carries it (a number, or an int64 as decimal text); else 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value if value >= 0 else 0
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return 0


def _code(status: Mapping[str, Any]) -> str:
    code = status.get("code")
    if isinstance(code, bool) or code is None:
        return UNKNOWN_CODE
    if isinstance(code, int | str) and str(code).strip():
        return str(code).strip()
    return UNKNOWN_CODE


@dataclass
class Rows:
    """The row counts of a batch output."""

    total: int = 0
    succeeded: int = 0
    failed: int = 0
    unreadable: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "total": self.total,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "unreadable": self.unreadable,
        }


@dataclass
class BatchLedger:
    """Counts of one batch output, fed chunk by chunk (see the module docstring)."""

    rows: Rows = field(default_factory=Rows)
    errors: dict[str, int] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_FIELDS, 0))
    size: int = 0
    _hash: Any = field(default_factory=hashlib.sha256, repr=False)
    _rest: bytearray = field(default_factory=bytearray, repr=False)
    _finished: bool = False

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Account for the next bytes of the output."""
        if self._finished:
            raise ValueError("the ledger is finished")
        if not chunk:
            return
        self._hash.update(chunk)
        self.size += len(chunk)
        data = bytes(chunk)
        last = data.rfind(b"\n")
        if last < 0:
            self._rest += data
            return
        if self._rest:
            head = bytes(self._rest) + data[:last]
            self._rest.clear()
        else:
            head = data[:last]
        self._rest += data[last + 1 :]
        self._lines(head)

    write = feed  # a ledger is a writable stream too

    def finish(self) -> BatchLedger:
        """Account for a last line without a newline; the ledger is complete."""
        if not self._finished:
            if self._rest:
                self.line(bytes(self._rest))
                self._rest.clear()
            self._finished = True
        return self

    @property
    def sha256(self) -> str:
        return str(self._hash.hexdigest())

    def _lines(self, head: bytes) -> None:
        """Account for the complete lines ``head`` holds (newline-separated, none at the end).

        The fast path decodes the block once and runs the JSON scanner (the one
        ``json.loads`` runs) on each line starting with ``{`` in place: when the object it
        reads ends exactly at the line's end, ``json.loads`` of that line alone reads the same
        object (the scanner looks at nothing past a value's last character but one, and a
        newline stops every token as the end of the text does). Any other line (blank,
        another start, trailing whitespace, an error, a value running past its newline) and
        a block that is not UTF-8 go through ``line``, the definition.
        """
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            for raw in head.split(b"\n"):
                self.line(raw)
            return
        scan, find, stop = _scan_once, text.find, len(text)
        pos = 0
        while True:
            end = find("\n", pos)
            if end < 0:
                end = stop
            if pos < end:
                if text.startswith("{", pos):
                    try:
                        row, last = scan(text, pos)
                    except (ValueError, StopIteration):  # a nested value may raise either
                        last = -1
                    if last == end:
                        self.rows.total += 1
                        self._row(row)
                    else:
                        self.line(text[pos:end].encode("utf-8"))
                else:
                    self.line(text[pos:end].encode("utf-8"))
            if end >= stop:
                return
            pos = end + 1

    def line(self, raw: bytes) -> None:
        """Account for one line (without its newline)."""
        if not raw or raw.isspace():  # ASCII whitespace only, as JSON's
            return  # a blank line is no row
        self.rows.total += 1
        row = _parse(raw)
        if row is None:
            self.rows.unreadable += 1
            return
        self._row(row)

    def _row(self, row: dict[str, Any]) -> None:
        """Account for one readable row (a JSON object)."""
        response = row.get("response")
        if isinstance(response, dict):
            self.rows.succeeded += 1
            usage = response.get("usageMetadata")
            if isinstance(usage, dict):
                sums = self.usage
                for key in USAGE_FIELDS:
                    value = usage.get(key)
                    if type(value) is int and value >= 0:  # the usual case, as _count says
                        sums[key] += value
                    elif value is not None:
                        sums[key] += _count(value)
            return
        status = row.get("status")
        if not isinstance(status, dict):
            status = row.get("error")
        if isinstance(status, dict):
            self.rows.failed += 1
            code = _code(status)
            self.errors[code] = self.errors.get(code, 0) + 1
            return
        self.rows.unreadable += 1


def _parse(raw: bytes) -> dict[str, Any] | None:
    """The JSON object a line holds, or None (not UTF-8, not JSON, not an object)."""
    try:
        row = _decode(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is one
        return None
    return row if isinstance(row, dict) else None


@dataclass
class VideoLedger:
    """Bytes and sha256 of one video, fed chunk by chunk."""

    size: int = 0
    _hash: Any = field(default_factory=hashlib.sha256, repr=False)

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        self._hash.update(chunk)
        self.size += len(chunk)

    write = feed

    @property
    def sha256(self) -> str:
        return str(self._hash.hexdigest())


def inlined_lines(responses: list[Mapping[str, Any]]) -> list[bytes]:
    """Inlined batch responses as the JSONL lines a file output would hold, in request order.

    Each item is the REST (camelCase) form of an ``InlinedResponse``: ``response`` or ``error``
    and ``metadata`` (carrying the request's ``key`` when it was given one); the line keeps the
    key at the top, as the file output does.
    """
    lines = []
    for item in responses:
        row: dict[str, Any] = {}
        metadata = item.get("metadata")
        if isinstance(metadata, Mapping) and "key" in metadata:
            row["key"] = metadata["key"]
        row.update(item)
        lines.append(json.dumps(row, separators=(",", ":"), sort_keys=True).encode("utf-8"))
    return lines
