"""The final result of a lineage: one line per original request, whichever attempt gave it
(pure: the outputs come in as chunk streams, the lines go out through ``write``; no I/O).

For each key the line kept is the one of the latest attempt that *answered* it (a ``response``
row, blocked or not); a key no attempt answered keeps its latest failure. Equal attempts: the
later member of the sequence wins, and within one member the later line. A member's row counts
only for a key that member was *given*: a retry batch whose input is known (``Member.input``)
answering a key its input did not hold is left out for that key (counted ``foreign``), so a
child never replaces the root's answer for a key it was never sent; the root was given every
key of the input.

Memory holds no key's text and no line of the whole lineage: the input's keys are a
``reading.KeyIndex`` (8-byte digests), and per key one packed int (``choose``: the member and
the line number), four bytes for the size of that line, one byte for the highest attempt whose
input held it, one byte per member with a known input (whether it was given the key) and one
whether it was placed; an output row is read strictly by ``reading.read_output`` (only the
fields the rules need are built).

``write_final`` writes ``final.jsonl`` **in the input's order**: one line per key of the input,
at its first line (an input the submit checks accepted holds no key twice), each chosen line
**the row's own bytes** with ``"attempt": n`` added as its last member (``reading.final_line``:
never re-serialised, so a number such as ``1e400`` stays as written); a key no output held, in
its place: ``{"key": k, "error": {"code": "missing", "message": "no attempt returned this
key"}, "attempt": n}`` where n is the highest attempt whose input held the key (0 when no
member's input is known to). Output keys the input lacks are left out (counted ``extra``, one
per line); so are unreadable lines (not UTF-8, not strict JSON: ``NaN``, ``Infinity``, a lone
surrogate escape; counted ``unreadable``): every line of ``final.jsonl`` is strict JSON. The
counts are the same whatever the order; with more than ``MAX_COUNTED_CODES`` failure codes, the
codes named are the first ones in input order.

Gemini's outputs are matched by key, never by position (the SDK's field doc says the responses
file is "written in the same order as the input requests", and users report it is not: see
``tests/unit/test_retry_final_order.py``; a retry batch holds only some keys in any case). So
the chosen lines are gathered in **windows**: the input is walked in order and cut into runs of
keys whose chosen lines (their sizes known from the first read), key texts and
``ENTRY_BYTES`` each add up to at most ``window_bytes`` (``WINDOW_BYTES``, 32 MiB; a window
holds at least one key); for each window the members' outputs are read again, parsing only the
lines chosen for the window's keys and stopping a member after its last such line, and the
window is written in input order. The outputs are read once to choose, then once per window
(one window when the chosen lines of the whole input fit in the budget); the input once for
the index and once per window, up to the window's last line.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opstate.domain.strict_json import dumps
from opstate.outcomes.plan import MAX_COUNTED_CODES, OTHER_CODES
from opstate.retry.reading import (
    KeyIndex,
    OutputRow,
    final_line,
    key_of,
    output_rows,
    read_output,
)
from opstate.retry.rules import lines, row_of

MISSING_CODE = "missing"
MISSING_MESSAGE = "no attempt returned this key"
UNKNOWN_CODE = "unknown"
# What a window may hold: the chosen lines of its keys, their key texts and ENTRY_BYTES a key
# (the objects that hold one key of a window: its slot, its place in the lookup, the line's)
WINDOW_BYTES = 32 * 1024 * 1024
ENTRY_BYTES = 768
# line numbers below 2**40; 41 alike: every reader shifts by the same _LINE_BITS and the ranks
# (a lineage's few members, < 2**20) still end below _RETRIED
_LINE_BITS = 40  # mutant: equivalent — 41 (above)
_ANSWERED = 1 << 62
_RETRIED = 1 << 61  # some attempt >= 1 had a line of the key (not part of the ranking)
_PLACE = (1 << 61) - 1  # of a packed choice: the member's rank and the line number


@dataclass(
    frozen=True,
    slots=True,  # mutant: equivalent — slots=False changes only the memory
)
class Member:
    """One batch of a lineage: its attempt (0 = the root), its name, its archived output
    (a callable giving a fresh chunk stream each call; None when it has none: expired,
    cancelled, failed whole) and, when known, its input's chunks (which keys it held)."""

    attempt: int
    name: str
    output: Callable[[], Iterable[bytes]] | None
    input: Callable[[], Iterable[bytes]] | None = None


@dataclass(
    frozen=True,
    slots=True,  # mutant: equivalent — slots=False changes only the memory
)
class FinalLedger:
    """What ``final.jsonl`` holds: ``total`` lines (one per original key), ``answered`` (with
    ``blocked`` among them), ``failed`` by code text (``"missing"`` for a key no attempt
    returned), ``retried`` (original keys some attempt >= 1 held), ``attempts`` (members),
    ``extra`` (output lines whose key the input lacks, left out), ``foreign`` (output lines of
    a key their member was not given, left out), ``unreadable`` (output lines that are not a
    strict JSON object, left out)."""

    total: int = 0
    answered: int = 0
    blocked: int = 0
    failed: Mapping[str, int] = field(default_factory=dict)
    retried: int = 0
    attempts: int = 0
    extra: int = 0
    foreign: int = 0
    unreadable: int = 0

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
    ranks = [0] * len(members)  # mutant: equivalent — [1]: every entry is overwritten below
    for rank, index in enumerate(order):
        ranks[index] = rank
    return ranks


def _rows(
    output: Callable[[], Iterable[bytes]], max_line_bytes: int
) -> Iterator[tuple[int, OutputRow | None]]:
    """(line number, strictly read row or None) of each non-blank output line."""
    return output_rows(_lines(output(), max_line_bytes))


def _lines(chunks: Iterable[bytes], max_line_bytes: int) -> Iterator[bytes]:
    return lines(chunks, max_line_bytes, skip_long=True)


def _input_keys(chunks: Iterable[bytes], max_line_bytes: int) -> Iterator[str]:
    for line in _lines(chunks, max_line_bytes):
        key = key_of(line)
        if key is not None:
            yield key


@dataclass
class _Choice:
    """``_choose``'s answer: per slot of the index, the packed choice (-1: none yet) and the
    size of its line; the lines left out."""

    best: array[int]
    size: array[int]
    extra: int = 0
    foreign: int = 0
    unreadable: int = 0


def _choose(
    members: Sequence[Member], max_line_bytes: int, index: KeyIndex, given: Sequence[Any]
) -> _Choice:
    """Per key slot: packed (answered, member rank, line number) of the line kept, with
    ``_RETRIED`` set when an attempt >= 1 had a line of the key; ``given[i]``: member i's
    given keys by slot (None: every key)."""
    ranks = _ranks(members)
    none = array("q", [-1])  # mutant: equivalent — -2: "none yet" is only read "< 0"
    choice = _Choice(none * len(index), array("I", bytes(4 * len(index))))
    best, size = choice.best, choice.size
    for position, member in enumerate(members):
        if member.output is None:
            continue
        base = ranks[position] << _LINE_BITS
        retried = _RETRIED if member.attempt >= 1 else 0
        mine = given[position]
        for number, row in _rows(member.output, max_line_bytes):
            if row is None:
                choice.unreadable += 1
                continue
            if row.key is None:
                continue
            slot = index.slot(row.key)
            if slot is None:
                choice.extra += 1
                continue
            if mine is not None and not mine[slot]:
                choice.foreign += 1
                continue
            found = row_of(row.value)
            packed = base | number | (_ANSWERED if found is not None and found.answered else 0)
            chosen = _better(best[slot], packed, retried)
            if chosen & ~_RETRIED == packed:  # this line is the slot's choice now
                size[slot] = len(row.line)  # 4 bytes: a line is under the cap (<= 256 MiB)
            best[slot] = chosen
    return choice


def _better(old: int, packed: int, retried: int) -> int:
    """The packed choice of a slot holding ``old`` (-1: none) once line ``packed`` is seen
    (``retried``: ``_RETRIED`` when its member is an attempt >= 1)."""
    # "old <= 0", "old < 1" alike: old == 0 is rank 0, line 0, not answered, not retried,
    # and a later line of the slot packs above 0, so both branches give packed | retried
    none_yet = old < 0  # mutant: equivalent — old <= 0 and old < 1 (above)
    if none_yet:
        return packed | retried
    # ">=" alike: a line is seen once, so two lines of a slot never pack equal
    newer = packed > old & ~_RETRIED  # mutant: equivalent — >= (above)
    if newer:
        return packed | retried | (old & _RETRIED)
    return old | retried


def choose(members: Sequence[Member], max_line_bytes: int) -> dict[str, int]:
    """key -> index in ``members`` of the member whose line is kept (see the module doc), over
    every key some output holds (each member taken as given every key)."""
    keys = list(
        dict.fromkeys(
            row.key
            for member in members
            if member.output is not None
            for _, row in _rows(member.output, max_line_bytes)
            if row is not None and row.key is not None
        )
    )
    index = KeyIndex(keys)
    best = _choose(members, max_line_bytes, index, [None] * len(members)).best
    by_rank = {rank: position for position, rank in enumerate(_ranks(members))}
    chosen = {}
    for key in keys:
        slot = index.slot(key)
        assert slot is not None
        chosen[key] = by_rank[(best[slot] & ~(_ANSWERED | _RETRIED)) >> _LINE_BITS]
    return chosen


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

    def line(self, found: _Found, retried: bool) -> None:
        if found.answered:
            self.answered += 1
            self.blocked += found.blocked
        else:
            self.failure(found.code or UNKNOWN_CODE)
        self.retried += retried


def _dump(value: Mapping[str, Any]) -> bytes:
    return dumps(value, compact=True).encode("utf-8") + b"\n"


def _given(
    members: Sequence[Member], index: KeyIndex, max_line_bytes: int
) -> tuple[list[bytearray | None], array[int]]:
    """Per member, the keys its input held, by slot (None when its input is not known: every
    key); and per slot the highest attempt >= 1 whose input held the key (0: none)."""
    given: list[bytearray | None] = []
    held: array[int] = array("B", bytes(len(index)))
    for member in members:
        if member.input is None:
            given.append(None)
            continue
        mine = bytearray(len(index))
        for key in _input_keys(member.input(), max_line_bytes):
            slot = index.slot(key)
            if slot is not None:
                mine[slot] = 1  # mutant: equivalent — 2: only its truth is read
                held[slot] = max(held[slot], min(member.attempt, 255))  # attempt 0: no change
        given.append(mine)
    return given, held


@dataclass(
    frozen=True,  # mutant: equivalent — False: nothing assigns to a gathered line
    slots=True,  # mutant: equivalent — slots=False changes only the memory
)
class _Found:
    """A chosen line gathered for a window: its bytes, whether it has an ``attempt`` of its own,
    its member's attempt, and what the ledger counts of it (the parsed row is let go)."""

    line: bytes
    own_attempt: bool
    attempt: int
    answered: bool
    blocked: bool
    code: str | None

    def pieces(self) -> Iterator[bytes]:
        """``reading.final_line`` of the row (``ValueError``: see there)."""
        return final_line(OutputRow(None, _NO_VALUE, self.line, self.own_attempt), self.attempt)


_NO_VALUE: dict[str, Any] = {}  # final_line reads a row's bytes only


def _found(row: OutputRow, attempt: int) -> _Found:
    rules_row = row_of(row.value)
    return _Found(
        row.line,
        row.attempt,
        attempt,
        rules_row is not None and rules_row.answered,
        rules_row is not None and rules_row.blocked,
        rules_row.code if rules_row is not None else None,
    )


class _Writer:
    """``write_final``'s state between windows: what ``_choose`` found, the members' ranks, the
    slots placed so far (a slot is placed once, at its key's first input line), the tally."""

    def __init__(
        self,
        members: Sequence[Member],
        index: KeyIndex,
        choice: _Choice,
        held: array[int],
        write: Callable[[bytes], object],
        max_line_bytes: int,
    ) -> None:
        self.members = members
        self.index = index
        self.choice = choice
        self.held = held
        self.write = write
        self.max_line_bytes = max_line_bytes
        self.ranks = _ranks(members)
        self.placed = bytearray(len(index))
        self.tally = _Tally()
        self.unreadable = choice.unreadable

    def window(
        self, input_chunks: Callable[[], Iterable[bytes]], first: int, budget: int
    ) -> tuple[array[int], list[str], int | None]:
        """The keys of the next window, from input line ``first`` on, in input order (each
        placed), and the input line the window after it starts at (None: the input ended)."""
        best, size, placed = self.choice.best, self.choice.size, self.placed
        slots: array[int] = array("q")
        keys: list[str] = []
        used = 0
        for number, line in enumerate(_lines(input_chunks(), self.max_line_bytes)):
            if number < first:
                continue
            key = key_of(line)
            slot = self.index.slot(key) if key is not None else None
            if key is None or slot is None or placed[slot]:
                continue
            cost = (size[slot] if best[slot] >= 0 else 0) + len(key) + ENTRY_BYTES
            if slots and used + cost > budget:
                return slots, keys, number
            used += cost
            placed[slot] = 1  # mutant: equivalent — 2: only its truth is read
            slots.append(slot)
            keys.append(key)
        return slots, keys, None

    def gather(self, slots: array[int]) -> list[_Found | None]:
        """The chosen line of each slot of a window (None: no line chosen, or the line is no
        longer there as it was read to choose), reading each member that holds some, up to the
        last of them."""
        best = self.choice.best
        wanted: dict[int, int] = {}  # packed place (rank, line) -> position in the window
        last: dict[int, int] = {}  # rank -> the member's last line wanted
        for position, slot in enumerate(slots):
            packed = best[slot]
            if packed < 0:
                continue
            place = packed & _PLACE
            wanted[place] = position
            rank = place >> _LINE_BITS
            last[rank] = max(last.get(rank, 0), place - (rank << _LINE_BITS))
        found: list[_Found | None] = [None] * len(slots)
        for position, member in enumerate(self.members):
            rank = self.ranks[position]
            if member.output is None or rank not in last:
                continue
            base, stop = rank << _LINE_BITS, last[rank]
            for number, line in enumerate(_lines(member.output(), self.max_line_bytes)):
                at = wanted.get(base | number)
                if at is not None:
                    row = read_output(line)
                    key = row.key if row is not None else None
                    if row is not None and key is not None and self.index.slot(key) == slots[at]:
                        found[at] = _found(row, member.attempt)
                if number >= stop:
                    break
        return found

    def put(self, slots: array[int], keys: list[str], found: list[_Found | None]) -> None:
        """Write a window's lines in input order: each chosen line, else the key's missing
        line."""
        best, held, tally = self.choice.best, self.held, self.tally
        for position, slot in enumerate(slots):
            got = found[position]
            if got is not None:
                try:
                    pieces = got.pieces()
                except ValueError:  # a large row with an attempt of its own: read as unreadable
                    self.unreadable += 1
                else:
                    tally.line(got, bool(best[slot] & _RETRIED) or held[slot] >= 1)
                    for piece in pieces:
                        self.write(piece)
                    continue
            attempt = held[slot]
            tally.failure(MISSING_CODE)
            tally.retried += attempt >= 1
            error = {"code": MISSING_CODE, "message": MISSING_MESSAGE}
            self.write(_dump({"key": keys[position], "error": error, "attempt": attempt}))


def write_final(
    members: Sequence[Member],
    input_chunks: Callable[[], Iterable[bytes]],
    write: Callable[[bytes], object],
    max_line_bytes: int,
    *,
    window_bytes: int = WINDOW_BYTES,
) -> FinalLedger:
    """Write one line per key of the root's input (``input_chunks``) through ``write``, in the
    input's order (each line ends with a newline), gathering the chosen lines a window of at
    most ``window_bytes`` at a time, and return its ledger (order, shapes and windows: the
    module doc)."""
    index = KeyIndex(_input_keys(input_chunks(), max_line_bytes))
    given, held = _given(members, index, max_line_bytes)
    choice = _choose(members, max_line_bytes, index, given)
    writer = _Writer(members, index, choice, held, write, max_line_bytes)
    first: int | None = 0
    while first is not None:
        slots, keys, first = writer.window(input_chunks, first, window_bytes)
        writer.put(slots, keys, writer.gather(slots))
    tally = writer.tally
    return FinalLedger(
        total=len(index),
        answered=tally.answered,
        blocked=tally.blocked,
        failed=tally.failed,
        retried=tally.retried,
        attempts=len(members),
        extra=choice.extra,
        foreign=choice.foreign,
        unreadable=writer.unreadable,
    )
