"""An in-process store with the same conditional-write semantics (tests, benchmarks)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from opstate.reducer import OpRecord
from opstate.store.port import WRITTEN, WriteOutcome, validate_record


class MemoryStore:
    def __init__(self) -> None:
        self._records: dict[str, OpRecord] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> OpRecord | None:
        with self._lock:
            return self._records.get(name)

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        validate_record(record)
        with self._lock:
            existing = self._records.get(record.name)
            if existing is not None:
                return WriteOutcome(ok=False, current=existing)
            self._records[record.name] = record
            return WRITTEN

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        validate_record(record)
        with self._lock:
            existing = self._records.get(record.name)
            if existing is None or existing.version != expected_version:
                return WriteOutcome(ok=False, current=existing)
            self._records[record.name] = record
            return WRITTEN

    def list_open(self, limit: int = 100) -> Sequence[OpRecord]:
        with self._lock:
            open_records = [r for r in self._records.values() if not r.terminal]
        open_records.sort(key=lambda r: (r.update_time_ns, r.name))
        return open_records[:limit]

    def all(self) -> list[OpRecord]:
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.name)

    def iter_all(self) -> Iterator[OpRecord]:
        """Every record by name (a snapshot taken when iteration starts)."""
        yield from self.all()

    def close(self) -> None:
        return None
