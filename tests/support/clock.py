"""A fake clock for the reconciler: wall and monotonic time advance only when told (or slept)."""

from __future__ import annotations

import threading

S = 1_000_000_000


class FakeClock:
    """``now_ns``/``monotonic`` read the fake time; ``sleep`` advances it (thread-safe)."""

    def __init__(self, start_ns: int) -> None:
        self._ns = start_ns
        self._lock = threading.Lock()
        self.slept = 0.0

    def now_ns(self) -> int:
        with self._lock:
            return self._ns

    def monotonic(self) -> float:
        with self._lock:
            return self._ns / S

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)
            with self._lock:
                self.slept += seconds

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._ns += int(seconds * S)

    def set(self, ns: int) -> None:
        with self._lock:
            self._ns = max(self._ns, ns)

    def remaining_ms(self, deadline_ns: int) -> int:
        return (deadline_ns - self.now_ns()) // 1_000_000
