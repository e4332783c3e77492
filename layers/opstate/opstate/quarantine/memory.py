"""The quarantines that live in this process: ``MemoryQuarantine`` (tests; the same dedupe and
bounds as the SQLite one) and ``LogQuarantine`` (no queue configured: the delivery is logged
whole at error level, so it is at least recoverable from the logs).
"""

from __future__ import annotations

import dataclasses
import threading

from opstate.quarantine.port import UNBOUNDED, Bounds, Delivery, Kept, tried_mark


class MemoryQuarantine:
    def __init__(self, bounds: Bounds = UNBOUNDED) -> None:
        self.bounds = bounds
        self._items: dict[str, Delivery] = {}
        self._tried: dict[str, int] = {}
        self._lock = threading.Lock()

    def put(self, delivery: Delivery) -> str:
        with self._lock:
            for kept in self._items.values():
                if delivery.webhook_id is not None and kept.webhook_id == delivery.webhook_id:
                    return kept.id
            total = sum(len(d.body) for d in self._items.values())
            self.bounds.check(len(self._items), total, len(delivery.body))
            self._items[delivery.id] = delivery
            return delivery.id

    def take(self, limit: int = 10) -> list[Kept]:
        with self._lock:
            items = sorted(
                self._items.values(),
                key=lambda d: (self._tried.get(d.id, 0), d.received_ns, d.id),
            )
        return [Kept(d, d.id) for d in items[:limit]]

    def remove(self, kept: Kept) -> None:
        with self._lock:
            self._items.pop(kept.handle, None)
            self._tried.pop(kept.handle, None)

    def skip(self, kept: Kept) -> None:
        with self._lock:
            if kept.handle in self._items:
                self._tried[kept.handle] = tried_mark()

    def entries(self, limit: int = 1000) -> list[Delivery]:
        with self._lock:
            return sorted(self._items.values(), key=lambda d: (d.received_ns, d.id))[:limit]

    def all(self) -> list[Delivery]:
        return self.entries(limit=len(self._items) or 1)


class LogQuarantine:
    """No quarantine configured: the delivery is logged whole (base64 body) at error level."""

    def put(self, delivery: Delivery) -> str:
        from opstate.observability import logger

        # Without its proof: signatures and tokens are never logged (opstate.observability).
        # A delivery recovered from the log is replayed by hand (opstate replay FILE).
        logger.error(
            "webhook quarantined to the log (no quarantine queue configured)",
            extra={"quarantined_delivery": dataclasses.replace(delivery, proof=()).to_json()},
        )
        return delivery.id

    def take(self, limit: int = 10) -> list[Kept]:
        return []

    def remove(self, kept: Kept) -> None:
        return None

    def skip(self, kept: Kept) -> None:
        return None

    def entries(self, limit: int = 1000) -> list[Delivery]:
        return []
