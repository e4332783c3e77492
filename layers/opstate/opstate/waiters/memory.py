"""Waiters in a dict (tests, ``memory://`` stores)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opstate.waiters.model import Waiter
from opstate.waiters.port import TooManyWaitersError


class MemoryWaiterStore:
    """Waiters by name, in registration order."""

    def __init__(self) -> None:
        self._waiters: dict[str, dict[str, Waiter]] = {}
        self._lock = threading.Lock()

    def add(self, waiter: Waiter, limit: int) -> bool:
        with self._lock:
            kept = self._waiters.setdefault(waiter.name, {})
            if waiter.waiter_id in kept:
                return False
            if len(kept) >= limit:
                raise TooManyWaitersError(f"{waiter.name} already has {len(kept)} waiter(s)")
            kept[waiter.waiter_id] = waiter
            return True

    def list(self, name: str) -> Sequence[Waiter]:
        with self._lock:
            return sorted(self._waiters.get(name, {}).values(), key=_order)

    def remove(self, name: str, waiter_id: str) -> None:
        with self._lock:
            kept = self._waiters.get(name)
            if kept is not None:
                kept.pop(waiter_id, None)
                if not kept:
                    del self._waiters[name]

    def close(self) -> None:
        return None


def _order(waiter: Waiter) -> tuple[int, str]:
    return (waiter.created_ns, waiter.waiter_id)
