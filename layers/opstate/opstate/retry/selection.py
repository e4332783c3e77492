"""Which keys of an attempt go into the next one, with bounded memory (pure: chunk streams in,
a membership test out; no I/O).

The rules are ``opstate.retry.rules``' own (``read_row``, ``is_transient``, ``select_retry``,
what ``transient_failures`` and ``reason_history`` compute over key texts); here they run over
the slots of the root input's ``reading.KeyIndex`` instead, so a pass whose attempt failed a
million keys holds a byte or two per key, never the keys' text:

1. the latest output: each key's last row, its transient reason or none (``reason``, a byte a
   key: the index of the reason in ``rules.REASONS`` + 1, 0 for none);
2. every output of the lineage so far (the latest one included): each candidate key's transient
   failures by reason (``history``, a byte a key and reason, counted up to 255);
3. the latest output again: each candidate is put through ``select_retry`` with its own reason
   and history (``chosen``, a byte a key).

A key the root input lacks is never chosen (the next attempt's lines are cut from that input).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from opstate.retry.reading import KeyIndex
from opstate.retry.rules import (
    REASONS,
    Row,
    TransientTable,
    is_money_refusal,
    is_transient,
    read_row,
    select_retry,
)

type Lines = Callable[[], Iterable[bytes]]


class Selection:
    """The keys chosen for the next attempt, by slot of ``index``."""

    def __init__(self, index: KeyIndex) -> None:
        self.index = index
        self.chosen = bytearray(len(index))
        self.count = 0
        # The message of a row of the latest output refused for money (``is_money_refusal``),
        # or None: the lineage stops, whatever else was chosen (issue 39).
        self.money: str | None = None

    def __contains__(self, key: object) -> bool:
        slot = self.index.slot(key) if isinstance(key, str) else None
        return slot is not None and bool(self.chosen[slot])

    def __len__(self) -> int:
        return self.count


def select_keys(
    index: KeyIndex,
    latest: Lines,
    outputs: Iterable[Lines],
    table: TransientTable,
    next_attempt: int,
    max_attempts: int,
) -> Selection:
    """The keys of ``index`` that attempt ``next_attempt`` holds (the module doc): ``latest``
    is the output the attempt retries, ``outputs`` every output so far (``latest`` among them,
    last)."""
    selection = Selection(index)
    if next_attempt > max_attempts or next_attempt < 1:
        return selection
    reason = _reasons(latest, index, table, selection)
    if not any(reason):
        return selection
    history = _history(outputs, index, table, reason)
    for slot, row in _rows(latest(), index):
        code = reason[slot]
        if not code or selection.chosen[slot] or row.key is None:
            continue
        seen = Counter({r: history[i][slot] for i, r in enumerate(REASONS) if history[i][slot]})
        chosen = {row.key: REASONS[code - 1]}
        if select_retry(chosen, {row.key: seen}, table, next_attempt, max_attempts):
            selection.chosen[slot] = 1
            selection.count += 1
    return selection


def _reasons(
    latest: Lines, index: KeyIndex, table: TransientTable, selection: Selection
) -> bytearray:
    """Per slot: the transient reason of the key's last row in ``latest`` (its index in
    ``REASONS`` + 1), 0 when that row is no transient failure or there is none; the first
    money refusal's message goes to ``selection.money``."""
    reason = bytearray(len(index))
    for slot, row in _rows(latest(), index):
        found = is_transient(row, table)
        reason[slot] = REASONS.index(found) + 1 if found is not None else 0
        if found is None and selection.money is None and is_money_refusal(row):
            selection.money = row.message[:200] or f"code {row.code}"
    return reason


def _history(
    outputs: Iterable[Lines], index: KeyIndex, table: TransientTable, reason: bytearray
) -> list[bytearray]:
    """Per reason, per slot of a candidate (``reason`` not 0): its transient failures of that
    reason over ``outputs`` (up to 255)."""
    history = [bytearray(len(index)) for _ in REASONS]
    for output in outputs:
        for slot, row in _rows(output(), index):
            found = is_transient(row, table) if reason[slot] else None
            if found is not None:
                counts = history[REASONS.index(found)]
                counts[slot] = min(counts[slot] + 1, 255)
    return history


def _rows(lines: Iterable[bytes], index: KeyIndex) -> Iterator[tuple[int, Row]]:
    """(slot, row) of each readable row whose key the index holds."""
    for line in lines:
        row = read_row(line)
        if row is None or row.key is None:
            continue
        slot = index.slot(row.key)
        if slot is not None:
            yield slot, row
