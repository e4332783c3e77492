"""How fast a run may go: a clock, a token-bucket rate limit, a shared backoff with a circuit
breaker, and the time budget. All thread-safe; all read time from one ``Clock`` so tests and
benchmarks run on a fake one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Clock(Protocol):
    """Wall time for records and schedules, monotonic time and sleep for pacing."""

    def now_ns(self) -> int: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def now_ns(self) -> int:
        return time.time_ns()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


class TokenBucket:
    """At most ``rate`` requests per second on average, bursts of at most ``burst``, shared by
    every worker of a run. ``reserve()`` takes a token and returns how long to wait before using
    it (0 when one was available), so waiting happens outside the lock and in reservation
    order. ``rate`` 0 or less: unlimited."""

    def __init__(self, rate: float, clock: Clock, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate)
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = self.burst
        self._at = clock.monotonic()

    def reserve(self) -> float:
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = self._clock.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= 1.0
            if self._tokens >= 0:
                return 0.0
            return -self._tokens / self.rate


@dataclass(frozen=True, slots=True)
class Backoff:
    """The shared pause after transient API failures.

    After the n-th consecutive failure every worker waits ``min(max_s, base_s * 2**(n-1))``
    (or the server's ``Retry-After`` if longer) before its next request; a successful answer
    resets the count. After ``trip_after`` consecutive failures (of any kind) the run stops
    starting work.
    """

    base_s: float = 0.5
    max_s: float = 5.0
    trip_after: int = 24

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return float(min(self.max_s, self.base_s * (2 ** min(failures - 1, 30))))


DEFAULT_BACKOFF = Backoff()


class Throttle:
    """Consecutive-failure count, shared pause and circuit breaker of one run."""

    def __init__(self, policy: Backoff, clock: Clock) -> None:
        self._policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._not_before = 0.0

    def success(self) -> None:
        with self._lock:
            self._failures = 0

    def failure(self, *, transient: bool, retry_after_s: float | None = None) -> None:
        with self._lock:
            self._failures += 1
            if transient:
                pause = max(self._policy.delay(self._failures), retry_after_s or 0.0)
                self._not_before = max(self._not_before, self._clock.monotonic() + pause)

    def wait_s(self) -> float:
        with self._lock:
            return max(0.0, self._not_before - self._clock.monotonic())

    @property
    def tripped(self) -> bool:
        with self._lock:
            return self._failures >= self._policy.trip_after


class Budget:
    """The run's time: ``remaining_ms`` (the Lambda context's) minus a safety margin.

    ``left(extra_s)`` is True while more than the margin plus ``extra_s`` is left; None as
    ``remaining_ms`` means no limit.
    """

    def __init__(self, remaining_ms: Callable[[], int] | None, margin_s: float) -> None:
        self._remaining_ms = remaining_ms
        self._margin_s = margin_s

    def left(self, extra_s: float = 0.0) -> bool:
        if self._remaining_ms is None:
            return True
        return self._remaining_ms() > (self._margin_s + extra_s) * 1000.0
