"""The final result of a lineage: one line per original request, whichever attempt gave it
(pure: the outputs come in as chunk streams, the lines go out through ``write``; no I/O).

For each key the line kept is the one of the latest attempt that *answered* it (a ``response``
row, blocked or not); a key no attempt answered keeps its latest failure. Equal attempts: the
later member of the sequence wins, and within one member the later line. Memory holds
key -> one int (``choose`` packs the member and the line number into it), never a line: the
outputs are read twice, once to choose, once to write.

``write_final`` writes ``final.jsonl``: first the chosen lines, in the order of the members
and of their lines, each parsed and re-serialised compactly with ``"attempt": n`` added; then,
in input order, a line for each original key no output held:
``{"key": k, "error": {"code": "missing", "message": "no attempt returned this key"},
"attempt": n}`` where n is the highest attempt whose input held the key (0 when no member's
input is known to). Output keys the input lacks are left out (counted ``extra``, one per line).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opstate.outcomes.plan import MAX_COUNTED_CODES, OTHER_CODES
from opstate.retry.rules import lines, parse_line, row_of

MISSING_CODE = "missing"
MISSING_MESSAGE = "no attempt returned this key"
UNKNOWN_CODE = "unknown"
_LINE_BITS = 40  # line numbers below 2**40
_ANSWERED = 1 << 62
_RETRIED = 1 << 61  # some attempt >= 1 had a line of the key (not part of the ranking)


@dataclass(frozen=True, slots=True)
class Member:
    """One batch of a lineage: its attempt (0 = the root), its name, its archived output
    (a callable giving a fresh chunk stream each call; None when it has none: expired,
    cancelled, failed whole) and, when known, its input's chunks (which keys it held)."""

    attempt: int
    name: str
    output: Callable[[], Iterable[bytes]] | None
    input: Callable[[], Iterable[bytes]] | None = None


@dataclass(frozen=True, slots=True)
class FinalLedger:
    """What ``final.jsonl`` holds: ``total`` lines (one per original key), ``answered`` (with
    ``blocked`` among them), ``failed`` by code text (``"missing"`` for a key no attempt
    returned), ``retried`` (original keys some attempt >= 1 held), ``attempts`` (members),
    ``extra`` (output lines whose key the input lacks, left out)."""

    total: int = 0
    answered: int = 0
    blocked: int = 0
    failed: Mapping[str, int] = field(default_factory=dict)
    retried: int = 0
    attempts: int = 0
    extra: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": {
                "total": self.total,
                "answered": self.answered,
                "blocked": self.blocked,
                "failed": sum(self.failed.values()),
            },
            "errors": dict(self.failed),
            "retried": self.retried,
            "attempts": self.attempts,
        }


def _ranks(members: Sequence[Member]) -> list[int]:
    """Each member's rank: by attempt, then by position (the later wins)."""
    order = sorted(range(len(members)), key=lambda i: (members[i].attempt, i))
    ranks = [0] * len(members)
    for rank, index in enumerate(order):
        ranks[index] = rank
    return ranks


def _keyed_rows(
    output: Callable[[], Iterable[bytes]], max_line_bytes: int
) -> Iterator[tuple[int, Any]]:
    """(line number, parsed line) of each output line that is a JSON object with a text key."""
    for number, line in enumerate(lines(output(), max_line_bytes, skip_long=True)):
        value = parse_line(line)
        if isinstance(value, dict) and isinstance(value.get("key"), str):
            yield number, value


def _choose(
    members: Sequence[Member], max_line_bytes: int, keys: Mapping[str, int] | None
) -> tuple[dict[str, int], int]:
    """key -> packed (answered, member rank, line number) of the line kept, with ``_RETRIED``
    set when an attempt >= 1 had a line of the key; and how many lines were left out because
    ``keys`` (when given) lacks their key."""
    ranks = _ranks(members)
    best: dict[str, int] = {}
    extra = 0
    for index, member in enumerate(members):
        if member.output is None:
            continue
        base = ranks[index] << _LINE_BITS
        retried = _RETRIED if member.attempt >= 1 else 0
        for number, value in _keyed_rows(member.output, max_line_bytes):
            key = value["key"]
            if keys is not None and key not in keys:
                extra += 1
                continue
            row = row_of(value)
            packed = base | number | (_ANSWERED if row is not None and row.answered else 0)
            old = best.get(key, -1)
            if old < 0:
                best[key] = packed | retried
            elif packed > old & ~_RETRIED:
                best[key] = packed | retried | (old & _RETRIED)
            elif retried:
                best[key] = old | retried
    return best, extra


def choose(members: Sequence[Member], max_line_bytes: int) -> dict[str, int]:
    """key -> index in ``members`` of the member whose line is kept (see the module doc)."""
    ranks = _ranks(members)
    by_rank = {rank: index for index, rank in enumerate(ranks)}
    best, _extra = _choose(members, max_line_bytes, None)
    mask = (1 << 20) - 1
    return {key: by_rank[(packed >> _LINE_BITS) & mask] for key, packed in best.items()}


def _input_keys(chunks: Iterable[bytes], max_line_bytes: int) -> Iterator[str]:
    for line in lines(chunks, max_line_bytes, skip_long=True):
        value = parse_line(line)
        if isinstance(value, dict) and isinstance(value.get("key"), str):
            yield value["key"]


class _Tally:
    """The counts of the lines written so far."""

    def __init__(self) -> None:
        self.answered = 0
        self.blocked = 0
        self.retried = 0
        self.failed: dict[str, int] = {}

    def failure(self, code: str) -> None:
        failed = self.failed
        if code not in failed and len(failed) >= MAX_COUNTED_CODES:
            code = OTHER_CODES
        failed[code] = failed.get(code, 0) + 1

    def line(self, value: Mapping[str, Any], retried: bool) -> None:
        row = row_of(value)
        if row is not None and row.answered:
            self.answered += 1
            self.blocked += row.blocked
        else:
            self.failure(row.code if row is not None and row.code else UNKNOWN_CODE)
        self.retried += retried


def _dump(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def _held(
    members: Sequence[Member], keys: Mapping[str, int], max_line_bytes: int
) -> dict[str, int]:
    """key -> the highest attempt >= 1 whose input (when known) held it."""
    held: dict[str, int] = {}
    for member in members:
        if member.attempt >= 1 and member.input is not None:
            for key in _input_keys(member.input(), max_line_bytes):
                if key in keys and held.get(key, -1) < member.attempt:
                    held[key] = member.attempt
    return held


def write_final(
    members: Sequence[Member],
    input_chunks: Callable[[], Iterable[bytes]],
    write: Callable[[bytes], object],
    max_line_bytes: int,
) -> FinalLedger:
    """Write one line per key of the root's input (``input_chunks``) through ``write`` (each
    line ends with a newline) and return its ledger (order and shapes: the module doc)."""
    keys: dict[str, int] = dict.fromkeys(_input_keys(input_chunks(), max_line_bytes), 0)
    held = _held(members, keys, max_line_bytes)
    best, extra = _choose(members, max_line_bytes, keys)
    ranks = _ranks(members)
    tally = _Tally()
    for index, member in enumerate(members):
        if member.output is None:
            continue
        base = ranks[index] << _LINE_BITS
        for number, value in _keyed_rows(member.output, max_line_bytes):
            key = value["key"]
            packed = best.get(key)
            if packed is None or packed & ~(_ANSWERED | _RETRIED) != base | number:
                continue
            tally.line(value, bool(packed & _RETRIED) or key in held)
            value["attempt"] = member.attempt
            write(_dump(value))
            keys[key] = 1  # written
    for key in [key for key, done in keys.items() if not done]:
        attempt = held.get(key, 0)
        tally.failure(MISSING_CODE)
        tally.retried += attempt >= 1
        error = {"code": MISSING_CODE, "message": MISSING_MESSAGE}
        write(_dump({"key": key, "error": error, "attempt": attempt}))
    return FinalLedger(
        total=len(keys),
        answered=tally.answered,
        blocked=tally.blocked,
        failed=tally.failed,
        retried=tally.retried,
        attempts=len(members),
        extra=extra,
    )
