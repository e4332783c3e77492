"""Which rows of a batch output are retried (pure: bytes in, keys out; no I/O).

A batch output is JSON Lines: ``{"key", "response": {...}}`` for a request that was answered
(``blocked`` when its response carries no answer, as ``opstate.outcomes.ledger.is_blocked``
says), ``{"key", "status"|"error": {"code", "message", "status"}}`` (a ``google.rpc.Status``)
for one that failed. A failed row has a *reason*, by its ``code``:

============================  =========================  ===============
reason                        code (HTTP or gRPC)        default limit
============================  =========================  ===============
``RESOURCE_EXHAUSTED``        429 or 8                   no limit
``UNAVAILABLE``               503 or 14                  no limit
``INTERNAL``                  500 or 13                  1 retry
``DEADLINE_EXCEEDED``         504 or 4                   1 retry
``ABORTED``                   409 or 10                  not retried
============================  =========================  ===============

A row without a code (or whose code is not a number) takes the reason its ``status`` text
names, when that is one of the five names; a numeric code outside the table (400, 403, 404,
9, ...) is permanent whatever its ``status`` says.

The *transient table* (``OPSTATE_RETRY_TRANSIENT``, default ``DEFAULT_TRANSIENT``) lists the
reasons retried, each optionally with ``:N``, the most retries of one key for that reason
(``INTERNAL:1``: one retry of a key that failed ``INTERNAL``; no ``:N``: as many as the
policy's ``maxAttempts`` allows). A ``RESOURCE_EXHAUSTED`` row is read by
``opstate.domain.refusals.refusal_of``, its ``details`` (QuotaFailure, RetryInfo, ErrorInfo)
first, then its message: a money refusal (depleted prepayment credits, a spending cap, billing
disabled) is permanent, since retrying it would only be refused again; a rate limit (a retry
delay, a per-minute quota, Gemini's standard "You exceeded your current quota, please check
your plan and billing details" sentence) and a per-day quota are retried. Every other failure
is permanent.

``lines`` splits a stream of chunks into lines (the input keeper refuses a line longer than
its cap, ``LineTooLongError``; the output readers skip it, ``skip_long=True``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

from opstate.domain.refusals import MONEY, refusal_of, sanitize_details
from opstate.domain.retry import parse_transient
from opstate.outcomes.ledger_reading import is_blocked
from opstate.outcomes.plan import MAX_CODE_CHARS
from opstate.retry.reading import read_output

RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
UNAVAILABLE = "UNAVAILABLE"
INTERNAL = "INTERNAL"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
ABORTED = "ABORTED"
REASONS = (RESOURCE_EXHAUSTED, UNAVAILABLE, INTERNAL, DEADLINE_EXCEEDED, ABORTED)
DEFAULT_TRANSIENT = "RESOURCE_EXHAUSTED,UNAVAILABLE,INTERNAL:1,DEADLINE_EXCEEDED:1"
# code text (HTTP status or gRPC code number) -> reason
CODE_REASONS: Mapping[str, str] = MappingProxyType(
    {
        "429": RESOURCE_EXHAUSTED,
        "8": RESOURCE_EXHAUSTED,
        "503": UNAVAILABLE,
        "14": UNAVAILABLE,
        "500": INTERNAL,
        "13": INTERNAL,
        "504": DEADLINE_EXCEEDED,
        "4": DEADLINE_EXCEEDED,
        "409": ABORTED,
        "10": ABORTED,
    }
)


class LineTooLongError(ValueError):
    """A line longer than the cap (``line``: its 1-based number in the stream)."""

    def __init__(self, line: int, max_line_bytes: int) -> None:
        super().__init__(f"line {line} is longer than {max_line_bytes} bytes")
        self.line = line
        self.max_line_bytes = max_line_bytes


# A held line may be the cap and its "\r"; one byte more and it is cut.
_CR = 1  # mutant: equivalent — 2: held a byte longer, the same lines are cut


class _LineCut:
    """``lines``' state between chunks: the unfinished last line (at most the cap of it)."""

    def __init__(self, max_line_bytes: int, skip_long: bool) -> None:
        self.max = max_line_bytes
        self.skip_long = skip_long
        self.carry = bytearray()
        self.skipping = False  # inside a long line that is being read past
        self.number = 0  # lines finished so far

    def too_long(self, line: bytes | bytearray) -> bool:
        """Longer than the cap (a last ``\\r`` not counted); raises unless long lines are
        skipped."""
        size = len(line)
        if size <= self.max or (size == self.max + 1 and line[-1:] == b"\r"):
            return False
        if not self.skip_long:
            raise LineTooLongError(self.number, self.max)
        return True

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        parts = chunk.split(b"\n")
        last = parts.pop()  # what follows the chunk's last newline (maybe b"")
        if parts and self.skipping:  # the end of a long line read past
            self.skipping = False
            self.number += 1  # mutant: equivalent — only skip_long skips: no number said
            parts = parts[1:]
        elif parts and self.carry:
            self.carry += parts[0]
            # handed over, not copied (a line may be the cap's size): a bytearray read as bytes
            parts[0] = cast(bytes, self.carry)
            self.carry = bytearray()
        limit = self.max
        for line in parts:
            self.number += 1
            over = len(line) > limit  # mutant: equivalent — too_long decides: > or >= alike
            if over and self.too_long(line):
                continue
            yield _without_cr(line)
        if not self.skipping:
            self.carry += last
            if len(self.carry) > limit + _CR:
                self.number += 1  # the line being held: its number, should it raise
                self.too_long(self.carry)
                self.number -= 1  # mutant: equivalent — only skip_long gets here: no number said
                self.skipping = True
                self.carry.clear()

    def end(self) -> Iterator[bytes]:
        if self.carry:
            self.number += 1
            line = cast(bytes, self.carry)  # handed over, not copied
            self.carry = bytearray()
            if not self.too_long(line):
                yield _without_cr(line)


def _without_cr(line: bytes) -> bytes:
    """A line without its last ``\\r`` (a gathered bytearray trimmed in place, not copied)."""
    if line[-1:] != b"\r":
        return line
    if isinstance(line, bytearray):
        del line[-1]
        return line
    return line[:-1]


def lines(
    chunks: Iterable[bytes], max_line_bytes: int, *, skip_long: bool = False
) -> Iterator[bytes]:
    """The lines of a chunk stream, without their newline (``\\r\\n`` too). A last line without
    a newline is a line; an empty stream, or one ending with a newline, has no empty last
    line. A line longer than ``max_line_bytes`` (its ``\\r`` not counted) raises
    ``LineTooLongError``, or with ``skip_long`` is read past without being held: memory is
    bounded by the cap and the chunk size, never by a line. A line that spans chunks comes as
    the ``bytearray`` it was gathered in (never copied again): a caller reads it, and copies
    it only to keep it."""
    cut = _LineCut(max_line_bytes, skip_long)
    for chunk in chunks:
        if chunk:
            yield from cut.feed(chunk)
    yield from cut.end()


@dataclass(
    frozen=True,
    slots=True,  # mutant: equivalent — slots=False changes only the memory
)
class TransientTable:
    """The reasons retried, each with its per-key limit of retries (None: no limit of its
    own)."""

    limits: Mapping[str, int | None] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        for reason, limit in self.limits.items():
            if reason not in REASONS:
                raise ValueError(f"unknown reason {reason!r}: expected one of {REASONS}")
            if limit is not None and (isinstance(limit, bool) or limit < 0):
                raise ValueError(f"{reason}: a limit is a whole number >= 0, not {limit!r}")
        object.__setattr__(self, "limits", MappingProxyType(dict(self.limits)))

    def __contains__(self, reason: object) -> bool:
        return reason in self.limits

    def text(self) -> str:
        """The table as ``OPSTATE_RETRY_TRANSIENT`` spells it (``parse_table`` reads it back)."""
        return ",".join(
            reason if limit is None else f"{reason}:{limit}"
            for reason, limit in self.limits.items()
        )


def parse_table(text: str) -> TransientTable:
    """``REASON[:N],...`` as ``OPSTATE_RETRY_TRANSIENT`` spells it, read by the settings' own
    parser (``opstate.domain.retry.parse_transient``: names any case, ``N`` 0-10, each name
    once), so no value passes the settings' check at init and fails here; ``""`` lists nothing.
    ``ValueError`` (``InvalidRetryError``) names the bad entry."""
    listed = text.strip()  # mutant: equivalent — lstrip is empty as often
    return TransientTable(parse_transient(text) if listed else {})


DEFAULT_TABLE = parse_table(DEFAULT_TRANSIENT)


@dataclass(
    frozen=True,
    slots=True,  # mutant: equivalent — slots=False changes only the memory
)
class Row:
    """One output line, as much of it as retries need. ``answered``: it has a ``response``
    object (``blocked`` when that carries no answer); otherwise it failed, with the ``code``
    (as text, like the ledger's counts; None when absent), ``status`` text and ``message``
    of its ``status`` (or ``error``) object, and its ``details`` as
    ``opstate.domain.refusals.sanitize_details`` keeps them."""

    key: str | None
    answered: bool
    blocked: bool
    code: str | None
    status: str | None
    message: str
    details: tuple[Mapping[str, Any], ...] = ()


def _code_text(code: object) -> str | None:
    if isinstance(code, bool) or not isinstance(code, int | str):
        return None
    text = str(code).strip()
    return text[:MAX_CODE_CHARS] if text else None


def row_of(value: object) -> Row | None:
    """The ``Row`` of a parsed line (None when it is not a JSON object)."""
    if not isinstance(value, dict):
        return None
    key = value.get("key")
    key = key if isinstance(key, str) else None
    response = value.get("response")
    if isinstance(response, dict):
        return Row(key, True, is_blocked(response), None, None, "")
    status = value.get("status")
    if not isinstance(status, dict):
        status = value.get("error")
    if not isinstance(status, dict):  # neither shape: a failure without a code
        return Row(key, False, False, None, None, "")
    text = status.get("status")
    message = status.get("message")
    return Row(
        key,
        False,
        False,
        _code_text(status.get("code")),
        text if isinstance(text, str) else None,
        message if isinstance(message, str) else "",
        tuple(sanitize_details(status.get("details"))),
    )


def read_row(line: bytes) -> Row | None:
    """The ``Row`` of an output line; None when it is blank, not a JSON object or unreadable.
    Read as ``opstate.retry.reading.read_output`` reads it: strictly, and building only the
    fields a row's rules look at (a 32 MiB row is never built whole)."""
    found = read_output(line)
    return row_of(found.value) if found is not None else None


def reason_of(row: Row) -> str | None:
    """The gRPC reason of a failed row (None for an answered row or a permanent code)."""
    if row.answered:
        return None
    if row.code is not None:
        reason = CODE_REASONS.get(row.code)
        if reason is not None or row.code.lstrip("-").isdigit():
            return reason
        if row.code in REASONS:  # a code spelled as its name
            return row.code
    return row.status if row.status in REASONS else None


def is_transient(row: Row, table: TransientTable) -> str | None:
    """The reason of a failed row when the table retries it; None when it is permanent."""
    reason = reason_of(row)
    if reason is None or reason not in table:
        return None
    if (
        reason == RESOURCE_EXHAUSTED
        and refusal_of(row.code, row.status, row.message, row.details).kind == MONEY
    ):
        return None  # the account cannot pay: retrying is refused again
    return reason


def is_money_refusal(row: Row) -> bool:
    """Whether a failed row says the account cannot pay (``refusal_of``: HTTP 402, depleted
    prepayment credits, a spending cap, billing disabled): permanent, and its lineage stops."""
    return not row.answered and (
        refusal_of(row.code, row.status, row.message, row.details).kind == MONEY
    )


def transient_failures(output_lines: Iterable[bytes], table: TransientTable) -> dict[str, str]:
    """key -> reason of each key whose (last) row in the output is a transient failure."""
    found: dict[str, str] = {}
    for line in output_lines:
        row = read_row(line)
        if row is None or row.key is None:
            continue
        reason = is_transient(row, table)
        if reason is None:
            found.pop(row.key, None)  # a later line of the key wins
        else:
            found[row.key] = reason
    return found


def reason_history(
    lines: Iterable[bytes], keys: Set[str], table: TransientTable
) -> dict[str, Counter[str]]:
    """For each key of ``keys`` that has any, how many transient failures of each reason its
    rows in ``lines`` (every attempt's output so far) hold."""
    history: dict[str, Counter[str]] = {}
    for line in lines:
        row = read_row(line)
        if row is None or row.key is None or row.key not in keys:
            continue
        reason = is_transient(row, table)
        if reason is not None:
            history.setdefault(row.key, Counter())[reason] += 1
    return history


def select_retry(
    candidates: Mapping[str, str],
    history: Mapping[str, Counter[str]],
    table: TransientTable,
    next_attempt: int,
    max_attempts: int,
) -> set[str]:
    """The keys of ``candidates`` (key -> reason of its current transient failure) that go
    into attempt ``next_attempt``: none past ``max_attempts``; a reason the table does not
    list, none; a reason with limit L, a key whose failures of that reason (``history``,
    counting the current one) are at most L."""
    if next_attempt > max_attempts or next_attempt < 1:
        return set()
    chosen: set[str] = set()
    for key, reason in candidates.items():
        if reason not in table:
            continue
        limit = table.limits[reason]
        if limit is not None:
            failures = max(history.get(key, Counter())[reason], 1)  # the current one counts
            if failures > limit:
                continue
        chosen.add(key)
    return chosen
