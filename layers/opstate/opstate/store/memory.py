"""An in-process store with the same conditional-write semantics (tests, benchmarks)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace

from opstate.domain.model import OpRecord
from opstate.store.port import (
    WRITTEN,
    ArchiveEntry,
    ArchiveState,
    Due,
    PollState,
    WriteOutcome,
    check_retry,
    initial_due,
    validate_record,
)
from opstate.store.retry_state import RetryState


class MemoryStore:
    """Records and poll states in dicts; ``iter_due`` sorts the open ones (no index)."""

    def __init__(self) -> None:
        self._records: dict[str, OpRecord] = {}
        self._polls: dict[str, PollState] = {}
        self._archives: dict[str, ArchiveState] = {}
        self._retries: dict[str, RetryState] = {}
        self._counters: dict[str, int] = {}
        self._lock = threading.Lock()

    def add_counter(self, counter: str, amount: int, cap: int) -> bool:
        if amount < 0:
            raise ValueError("a counter is only added to")
        with self._lock:
            value = self._counters.get(counter, 0) + amount
            if value > cap:
                return False
            self._counters[counter] = value
            return True

    def get_counter(self, counter: str) -> int:
        with self._lock:
            return self._counters.get(counter, 0)

    def get(self, name: str) -> OpRecord | None:
        with self._lock:
            return self._records.get(name)

    def get_many(self, names: Sequence[str]) -> dict[str, OpRecord]:
        with self._lock:
            return {n: r for n in dict.fromkeys(names) if (r := self._records.get(n)) is not None}

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        validate_record(record)
        with self._lock:
            existing = self._records.get(record.name)
            if existing is not None:
                return WriteOutcome(ok=False, current=existing)
            self._records[record.name] = record
            self._polls[record.name] = PollState(due_ns=initial_due(record))
            return WRITTEN

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        validate_record(record)
        with self._lock:
            existing = self._records.get(record.name)
            if existing is None or existing.version != expected_version:
                return WriteOutcome(ok=False, current=existing)
            self._records[record.name] = record
            poll = self._polls.get(record.name, PollState(due_ns=initial_due(record)))
            if poll.lost:  # seen again: back into the open index, due at once
                poll = replace(poll, due_ns=initial_due(record))
            self._polls[record.name] = replace(poll, misses=0, missing_since_ns=0, lost_ns=0)
            return WRITTEN

    def list_open(self, limit: int = 100) -> Sequence[OpRecord]:
        if limit <= 0:
            return []
        return [entry.record for _, entry in zip(range(limit), self.iter_due(None), strict=False)]

    def iter_due(self, now_ns: int | None, page_size: int = 100) -> Iterator[Due]:
        with self._lock:
            entries = [
                Due(r, self._polls.get(r.name, PollState(due_ns=initial_due(r))))
                for r in self._records.values()
                if not r.terminal
            ]
        entries = [
            e for e in entries if not e.poll.lost and (now_ns is None or e.poll.due_ns <= now_ns)
        ]
        entries.sort(key=lambda e: (e.poll.due_ns, e.record.name))
        yield from entries

    def set_poll(self, name: str, version: int, poll: PollState) -> bool:
        with self._lock:
            existing = self._records.get(name)
            if existing is None or existing.version != version or existing.terminal:
                return False
            previous = self._polls.get(name)
            if poll.progress is None and previous is not None and previous.progress is not None:
                poll = replace(poll, progress=previous.progress)
            self._polls[name] = poll
            return True

    def get_progress(self, name: str) -> dict[str, int] | None:
        with self._lock:
            poll = self._polls.get(name)
        return dict(poll.progress) if poll is not None and poll.progress is not None else None

    def iter_marked(self) -> Iterator[Due]:
        with self._lock:
            entries = [
                Due(r, self._polls[r.name])
                for r in self._records.values()
                if not r.terminal
                and r.name in self._polls
                and (self._polls[r.name].lost or self._polls[r.name].overdue_ns)
            ]
        yield from sorted(entries, key=lambda e: e.record.name)

    def get_archive(self, name: str) -> ArchiveState | None:
        with self._lock:
            return self._archives.get(name)

    def set_archive(self, name: str, expected_rev: int, state: ArchiveState) -> bool:
        with self._lock:
            existing = self._records.get(name)
            if existing is None or not existing.terminal:
                return False
            if existing.created_ns != state.created_ns:
                return False
            current = self._archives.get(name)
            if (current.rev if current is not None else 0) != expected_rev:
                return False
            self._archives[name] = replace(state, rev=expected_rev + 1)
            return True

    def iter_archive_due(self, now_ns: int) -> Iterator[ArchiveEntry]:
        with self._lock:
            entries = [
                ArchiveEntry(r, self._archives.get(r.name))
                for r in self._records.values()
                if r.terminal
            ]
        due = [
            e
            for e in entries
            if e.archive is None or (e.archive.open and e.archive.due_ns <= now_ns)
        ]
        due.sort(key=lambda e: (e.archive.due_ns if e.archive else 0, e.record.name))
        yield from due

    def get_retry(self, name: str) -> RetryState | None:
        with self._lock:
            return self._retries.get(name) if name in self._records else None

    def set_retry(self, name: str, expected_rev: int, state: RetryState) -> bool:
        check_retry(state)  # refuses a state no store could hold, before anything is written
        with self._lock:
            existing = self._records.get(name)
            if existing is None or existing.created_ns != state.created_ns:
                return False
            current = self._retries.get(name)
            if (current.rev if current is not None else 0) != expected_rev:
                return False
            self._retries[name] = replace(state, rev=expected_rev + 1)
            return True

    def iter_retry_due(self, now_ns: int) -> Iterator[tuple[OpRecord, RetryState]]:
        with self._lock:
            due = [
                (self._records[name], state)
                for name, state in self._retries.items()
                if name in self._records and state.active and state.due_ns <= now_ns
            ]
        due.sort(key=lambda pair: (pair[1].due_ns, pair[0].name))
        yield from due

    def poll_state(self, name: str) -> PollState | None:
        """The poll state of ``name`` (tests)."""
        with self._lock:
            return self._polls.get(name)

    def all(self) -> list[OpRecord]:
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.name)

    def iter_all(self) -> Iterator[OpRecord]:
        """Every record by name (a snapshot taken when iteration starts)."""
        yield from self.all()

    def close(self) -> None:
        return None
