"""The ledger: what a batch's output held, computed while it streams past (pure: bytes in,
counts out, no I/O).

A batch output is JSON Lines, one line per request: ``{"key", "response": {...}}`` for a
request that succeeded, ``{"key", "status"|"error": {"code", "message"}}`` (a
``google.rpc.Status``) for one that failed. ``BatchLedger.feed`` takes the bytes in whatever
chunks they arrive (a line may be cut anywhere, even inside a UTF-8 sequence) and keeps only the
unfinished last line between calls, at most ``max_line_bytes`` of it, so memory is bounded by
that cap, never by the file or its longest line:

- rows: ``total`` (non-blank lines), ``succeeded`` (a line with a ``response`` object),
  ``failed`` (a line with a ``status`` or ``error`` object and no ``response``), ``unreadable``
  (anything else: not JSON, not an object, neither shape; and any line longer than
  ``max_line_bytes``, whatever it holds: it is read past, never held); and ``blocked``, the
  succeeded rows whose response carries no answer (``is_blocked``), counted in ``succeeded``
  too, not instead of it;
- ``errors``: failed rows by their error ``code`` (``"unknown"`` when it has none; a code is
  cut to ``plan.MAX_CODE_CHARS`` characters, and after ``plan.MAX_COUNTED_CODES`` different
  codes a new one counts under ``"other"``);
- ``usage``: the sum over succeeded rows of ``response.usageMetadata``'s six token counts
  (``USAGE_FIELDS``; a missing or null field counts 0; a value that is no count, as
  ``ledger_reading._count`` reads one, makes the row ``unreadable``: issue 47);
- ``bands``: the same sums and the per-modality ones (``DETAIL_KEYS``: each ``*TokensDetails``
  list's counts by modality), and how many rows made them, per price band (issue 41): the row's
  ``response.modelVersion`` (None when it names none; at most ``MAX_BAND_MODELS`` different
  ones, then ``OTHER_MODEL``) and how many of ``PRICE_TIER_STARTS`` its prompt
  (``promptTokenCount`` + ``toolUsePromptTokenCount``, what a tiered price is chosen by) is
  over. A tiered Gemini price applies to a whole request by its prompt size, so one row above
  200k tokens costs more per token than one below; every row of a band pays the same rates, so
  a band's sums are priced at once (``opstate.outcomes.price``), never row by row;
- ``size`` (bytes) and ``sha256`` of everything fed.

``VideoLedger`` is the same for one video (bytes and sha256 only).

How a line is read (each way counts exactly what ``json.loads`` of the line alone counts; the
Hypothesis tests compare every way with that definition over arbitrary bytes and cuts): with
msgspec installed (the archiver's requirements) each line goes straight from its bytes into
``ledger_rows``' structs, skipping every field the ledger does not count; without it, json's
own scanner runs in place over a block of lines decoded once. A line either way cannot read
exactly goes through ``line``, the definition. A line nested too deep for ``json.loads``
(``RecursionError``) is unreadable, not the end of the archive.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from opstate.outcomes.ledger_reading import (
    DETAIL_KEYS,
    MAX_BAND_MODELS,
    OTHER_MODEL,
    PRICE_TIER_STARTS,
    USAGE_FIELDS,
    BandKey,
    UnreadableRowError,
    _code,
    _cut,
    _is_utf8,
    _text,
    band_of,
    is_blocked,
    usage_counts,
)
from opstate.outcomes.plan import MAX_COUNTED_CODES, OTHER_CODES

try:
    from opstate.outcomes.ledger_rows import (
        ROW_ERRORS,
        USAGE_GETTERS,
        Row,
        add_details,
        counts_of,
        decode_row,
    )
    from opstate.outcomes.ledger_rows import is_blocked as struct_is_blocked

    HAVE_MSGSPEC = True
except ImportError:  # the stdlib way (below) counts the same, slower
    HAVE_MSGSPEC = False

# The longest line counted (bytes, without its newline); a longer one is an unreadable row
# (``OPSTATE_RESULTS_MAX_LINE_MIB``).
DEFAULT_MAX_LINE_BYTES = 32 * 1024 * 1024
# One decoder, bound once: json.loads would re-check its arguments and sniff the encoding of
# bytes on every line.
_decoder = json.JSONDecoder()
_decode = _decoder.decode
# The scanner decode runs (the C one when there is one): (value, end index) of the JSON value
# at an index of a text.
_scan_once: Callable[[str, int], tuple[Any, int]] = _decoder.scan_once  # type: ignore[attr-defined]


@dataclass
class Rows:
    """The row counts of a batch output (``blocked`` rows are among the ``succeeded``)."""

    total: int = 0
    succeeded: int = 0
    blocked: int = 0
    failed: int = 0
    unreadable: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "total": self.total,
            "succeeded": self.succeeded,
            "blocked": self.blocked,
            "failed": self.failed,
            "unreadable": self.unreadable,
        }


@dataclass
class Digest:
    """Size and sha256 of the bytes fed, in order (``hashlib`` releases the interpreter while
    it hashes a chunk, so ``digest`` may run in a thread of its own beside the counting)."""

    size: int = 0
    _hash: Any = field(default_factory=hashlib.sha256, repr=False)

    def digest(self, chunk: bytes | bytearray | memoryview) -> None:
        self._hash.update(chunk)
        self.size += len(chunk)

    @property
    def sha256(self) -> str:
        return str(self._hash.hexdigest())


@dataclass
class VideoLedger(Digest):
    """Bytes and sha256 of one video, fed chunk by chunk."""

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        self.digest(chunk)

    write = feed


@dataclass
class BatchLedger(Digest):
    """Counts of one batch output, fed chunk by chunk (see the module docstring).

    ``feed`` is ``digest`` (size, sha256) then ``count`` (the lines); a caller may run the two
    apart, each over every chunk in order."""

    rows: Rows = field(default_factory=Rows)
    errors: dict[str, int] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_FIELDS, 0))
    # (modelVersion, band) -> [rows, the six sums in USAGE_FIELDS order, then the
    # per-modality ones in DETAIL_KEYS order], for every band
    # but the usual one (``_usual``: the first model seen in band 0), whose sums are the
    # totals less these (``bands``): a row of the usual band costs one comparison.
    _bands: dict[BandKey, list[int]] = field(default_factory=dict, repr=False)
    _usual: str | None = field(default=None, repr=False)
    _has_usual: bool = field(default=False, repr=False)
    _usage_rows: int = field(default=0, repr=False)  # rows that reported their usage
    _details: list[int] = field(default_factory=lambda: [0] * len(DETAIL_KEYS), repr=False)
    # A line longer than this (bytes, without its newline) is one unreadable row.
    max_line_bytes: int = field(default=DEFAULT_MAX_LINE_BYTES, repr=False)
    _rest: bytearray = field(default_factory=bytearray, repr=False)
    # The unfinished line is past max_line_bytes: read past until its newline, not kept.
    _overlong: bool = field(default=False, repr=False)
    _finished: bool = False
    # Read lines with msgspec (when installed); False: the stdlib way (tests run both).
    use_msgspec: bool = field(default=HAVE_MSGSPEC, repr=False)

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Account for the next bytes of the output (``count`` refuses a finished ledger)."""
        self.count(chunk)
        self.digest(chunk)

    write = feed  # a ledger is a writable stream too

    def count(self, chunk: bytes | bytearray | memoryview) -> None:
        """Count the lines the next bytes complete (the sha256 and size are ``digest``'s).

        Only the unfinished line before the chunk's first newline and after its last one is
        copied, and only while it is within ``max_line_bytes``; the whole lines between are
        read in place."""
        if self._finished:
            raise ValueError("the ledger is finished")
        data = chunk if type(chunk) is bytes else bytes(chunk)
        first = data.find(b"\n")
        if first < 0:
            self._hold(data, 0)
            return
        ascii_only = data.isascii()
        if self._overlong or len(self._rest) + first > self.max_line_bytes:
            self._read_past()
        elif self._rest:
            self._rest += data[:first]
            line = bytes(self._rest)
            self._rest.clear()
            self._lines(line, 0, len(line), line.isascii())
        elif first:
            self._lines(data, 0, first, ascii_only)
        last = data.rfind(b"\n")
        if last > first + 1:
            self._lines(data, first + 1, last, ascii_only)
        if last + 1 < len(data):
            self._hold(data, last + 1)

    def _hold(self, data: bytes, start: int) -> None:
        """Keep ``data[start:]``, the start of an unfinished line, unless the line has grown
        past ``max_line_bytes``: then it is dropped and read past until its newline."""
        if self._overlong:
            return
        if len(self._rest) + len(data) - start > self.max_line_bytes:
            self._rest = bytearray()  # frees what it held
            self._overlong = True
        elif start:
            self._rest += data[start:]
        else:
            self._rest += data

    def _read_past(self) -> None:
        """The line being read past (longer than ``max_line_bytes``) ended: one unreadable
        row."""
        self._rest = bytearray()
        self._overlong = False
        self.rows.total += 1
        self.rows.unreadable += 1

    def finish(self) -> BatchLedger:
        """Account for a last line without a newline; the ledger is complete."""
        if not self._finished:
            if self._overlong:
                self._read_past()
            elif self._rest:
                self.line(bytes(self._rest))
                self._rest.clear()
            self._finished = True
        return self

    def _lines(self, data: bytes, start: int, stop: int, ascii_only: bool) -> None:
        """Account for the complete lines of ``data[start:stop]`` (newline-separated, none at
        the end). A block longer than ``max_line_bytes`` (a chunk larger than the cap: never
        the SDK's 1 MiB) is first split around its lines past the cap."""
        if stop - start > self.max_line_bytes:
            self._split_long(data, start, stop, ascii_only)
        else:
            self._block(data, start, stop, ascii_only)

    def _split_long(self, data: bytes, start: int, stop: int, ascii_only: bool) -> None:
        """``_lines`` of a block that may hold lines past ``max_line_bytes``: each such line
        is one unreadable row, the runs of lines between go to ``_block``."""
        run = pos = start
        while pos <= stop:
            end = data.find(b"\n", pos, stop)
            end = stop if end < 0 else end
            if end - pos > self.max_line_bytes:
                if pos - 1 > run:
                    self._block(data, run, pos - 1, ascii_only)
                self._read_past()
                run = end + 1
            pos = end + 1
        if stop > run:
            self._block(data, run, stop, ascii_only)

    def _block(self, data: bytes, start: int, stop: int, ascii_only: bool) -> None:
        """``_lines`` of a block whose lines are all within the cap. A block that is not UTF-8
        is read line by line by the definition (``line``); any other goes the fast way (see
        the module docstring)."""
        view = memoryview(data)[start:stop]
        if self.use_msgspec:
            if ascii_only or _is_utf8(view):
                self._read_structs(data, start, stop)
                return
        else:
            text = _text(view)
            if text is not None:
                self._scan(text)
                return
        for raw in bytes(view).split(b"\n"):
            self.line(raw)

    def _read_structs(self, data: bytes, start: int, stop: int) -> None:
        """Each line of a UTF-8 block through msgspec into ``ledger_rows.Row`` (a zero-copy
        view of the line: no value it skips is built), then all the rows counted at once; a
        line msgspec refuses goes to ``line``."""
        view, find = memoryview(data), data.find
        decode, errors = decode_row, ROW_ERRORS
        rows: list[Row] = []
        keep = rows.append
        pos = start
        while True:
            end = find(b"\n", pos, stop)
            if end < 0:
                end = stop
            if pos < end:
                try:
                    keep(decode(view[pos:end]))
                except errors:
                    self.line(data[pos:end])
            if end >= stop:
                break
            pos = end + 1
        self._count_structs(rows)

    def _count_structs(self, rows: list[Row]) -> None:
        """``_row`` for many rows msgspec read: a field is None where ``_row`` finds no object
        (the structs refuse any other value), a count is an int >= 0 (the structs refuse any
        other, which ``line`` then counts)."""
        responses = [row.response for row in rows if row.response is not None]
        self.rows.total += len(rows)
        self.rows.succeeded += len(responses)
        self.rows.blocked += sum(map(struct_is_blocked, responses))
        usages = [u for r in responses if (u := r.usage_metadata) is not None]
        if usages:
            sums = self.usage
            block = [sum(map(get, usages)) for _key, get in USAGE_GETTERS]
            for (key, _get), total in zip(USAGE_GETTERS, block, strict=True):
                sums[key] += total
            add_details(usages, self._details, 0)
            priced = responses
            if len(usages) < len(responses):
                priced = [r for r in responses if r.usage_metadata is not None]
            self._band_structs(priced, usages, block)
        if len(responses) == len(rows):
            return
        for row in rows:
            if row.response is None:
                status = row.status if row.status is not None else row.error
                if status is not None:
                    self._add_failed(status.code)
                else:
                    self.rows.unreadable += 1

    @property
    def bands(self) -> dict[BandKey, list[int]]:
        """(modelVersion, band) -> [rows, the six sums in ``USAGE_FIELDS`` order, then the
        per-modality ones in ``DETAIL_KEYS`` order]."""
        found = {key: list(sums) for key, sums in self._bands.items()}
        if self._has_usual:
            usual = [self._usage_rows, *(self.usage[k] for k in USAGE_FIELDS), *self._details]
            for sums in self._bands.values():
                for i, value in enumerate(sums):
                    usual[i] -= value
            if usual[0]:
                found[(self._usual, 0)] = usual
        return found

    def _is_usual(self, name: str | None, prompt: int) -> bool:
        """Whether a row of model ``name`` (cut) and prompt size ``prompt`` is of the usual
        band (the first row in band 0 makes its model the usual one)."""
        if prompt > PRICE_TIER_STARTS[0]:
            return False
        if not self._has_usual:
            self._usual, self._has_usual = name, True
            return True
        return name == self._usual

    def _band_structs(self, priced: list[Any], usages: list[Any], block: list[int]) -> None:
        """``bands`` of rows msgspec read, each with its usage (``usages``; ``block``: their
        sums): nothing more to do when they all name one model and no prompt can be over the
        lowest tier start (the largest prompt plus the largest tool-use prompt is not: the
        usual block), else row by row."""
        self._usage_rows += len(usages)
        models = set(map(_MODEL_OF, priced))
        if len(models) == 1:
            top = max(map(_PROMPT_OF, usages)) + max(map(_TOOL_OF, usages))
            if self._is_usual(_cut(models.pop()), top):
                return
        for row, usage in zip(priced, usages, strict=True):
            self._add_band(row.model_version, counts_of(usage))

    def _add_band(self, model: object, counts: Sequence[int]) -> None:
        """One row's counts (``USAGE_FIELDS`` then ``DETAIL_KEYS``) into its band (the usual
        one's sums are
        the totals'; a model past ``MAX_BAND_MODELS`` counts as ``OTHER_MODEL``)."""
        prompt = counts[_PROMPT_AT] + counts[_TOOL_AT]
        name = _cut(model)
        if self._is_usual(name, prompt):
            return
        bands = self._bands
        key = (name, band_of(prompt))
        sums = bands.get(key)
        if sums is None:
            known = {m for m, _ in bands if m is not None}
            if self._usual is not None:
                known.add(self._usual)
            if name is not None and name not in known and len(known) >= MAX_BAND_MODELS:
                key = (OTHER_MODEL, key[1])
            sums = bands.setdefault(key, [0] * (1 + len(USAGE_FIELDS) + len(DETAIL_KEYS)))
        sums[0] += 1
        for i, value in enumerate(counts, 1):
            sums[i] += value

    def _scan(self, text: str) -> None:
        """The stdlib way: json's scanner (the one ``json.loads`` runs) on each line of a
        decoded block starting with ``{``, in place. When the object it reads ends exactly at
        the line's end, ``json.loads`` of that line alone reads the same object (the scanner
        looks at nothing past a value's last character but one, and a newline stops every
        token as the end of the text does). Any other line (blank, another start, trailing
        whitespace, an error, a value running past its newline) goes through ``line``."""
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
                    # a nested value may raise either; too deep raises RecursionError
                    except (ValueError, StopIteration, RecursionError):
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
        """Account for one JSON object row (``unreadable`` when a value in it is no count)."""
        response = row.get("response")
        if isinstance(response, dict):
            usage = response.get("usageMetadata")
            try:
                counts = usage_counts(usage) if isinstance(usage, dict) else None
            except UnreadableRowError:
                self.rows.unreadable += 1
                return
            self.rows.succeeded += 1
            if is_blocked(response):
                self.rows.blocked += 1
            if counts is not None:
                self._add_usage(counts)
                self._usage_rows += 1
                self._add_band(response.get("modelVersion"), counts)
            return
        status = row.get("status")
        if not isinstance(status, dict):
            status = row.get("error")
        if isinstance(status, dict):
            self._add_failed(status.get("code"))
            return
        self.rows.unreadable += 1

    def _add_usage(self, counts: Sequence[int]) -> None:
        """Add a succeeded row's counts (``usage_counts``) to the sums."""
        sums = self.usage
        for key, n in zip(USAGE_FIELDS, counts, strict=False):
            sums[key] += n
        if len(counts) > len(USAGE_FIELDS):
            details = self._details
            for i, n in enumerate(counts[len(USAGE_FIELDS) :]):
                details[i] += n

    def _add_failed(self, code: object) -> None:
        self.rows.failed += 1
        key, errors = _code(code), self.errors
        if key not in errors and len(errors) >= MAX_COUNTED_CODES:
            key = OTHER_CODES
        errors[key] = errors.get(key, 0) + 1


_PROMPT_AT = USAGE_FIELDS.index("promptTokenCount")
_TOOL_AT = USAGE_FIELDS.index("toolUsePromptTokenCount")
# A msgspec row's model, and its usage's prompt and tool-use prompt counts.
_MODEL_OF = attrgetter("model_version")
_PROMPT_OF = attrgetter("prompt_token_count")
_TOOL_OF = attrgetter("tool_use_prompt_token_count")


def _parse(raw: bytes) -> dict[str, Any] | None:
    """The JSON object a line holds, or None (not UTF-8, not JSON, not an object)."""
    try:
        row = _decode(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return row if isinstance(row, dict) else None
