"""A chaos wrapper around a real store: throttles, timeouts, and writes whose response is lost.

Faults, each drawn at random per call (seeded, thread-safe):

- ``throttle``: the call is refused before it reaches the store (``StoreUnavailableError``);
  applies to reads and writes.
- ``timeout``: a write times out before the store applied it (a short pause, then
  ``StoreUnavailableError``); nothing was written.
- ``lost_response``: the nasty one. The write goes through on the real store, then the response
  is lost: ``StoreUnavailableError`` is raised AFTER the write landed. The caller cannot tell it
  from a timeout, answers 503, and the sender retries an event that is already stored.

``landed`` counts, per operation name, the writes that really landed on the inner store (those
whose response was delivered and those whose response was lost), so a test can check that a
record's ``version`` equals the number of applied decisions that landed. ``force(kind)`` queues a
fault for the next write, for deterministic tests.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

from opstate.domain.model import OpRecord
from opstate.store.port import Store, StoreUnavailableError, WriteOutcome
from tests.support.stores import DelegatingStore

THROTTLE = "throttle"
TIMEOUT = "timeout"
LOST_RESPONSE = "lost_response"


@dataclass(frozen=True)
class ChaosRates:
    throttle: float = 0.1
    timeout: float = 0.05
    lost_response: float = 0.1

    def __post_init__(self) -> None:
        if min(self.throttle, self.timeout, self.lost_response) < 0:
            raise ValueError("rates must not be negative")
        if self.throttle + self.timeout + self.lost_response >= 1:
            raise ValueError("the fault rates must add up to less than 1")


class ChaosStore(DelegatingStore):
    """Wraps ``inner`` (any store of the port) and injects faults (see the module docstring)."""

    def __init__(
        self,
        inner: Store,
        rates: ChaosRates | None = None,
        *,
        seed: int = 0,
        timeout_pause_s: float = 0.001,
    ) -> None:
        super().__init__(inner)
        self.rates = rates or ChaosRates()
        self.timeout_pause_s = timeout_pause_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._forced: deque[str] = deque()
        self.enabled = True
        self.landed: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    # -- control ---------------------------------------------------------------------------

    def force(self, *kinds: str) -> None:
        """Make the next writes fail with these faults, in order (before any random draw)."""
        for kind in kinds:
            if kind not in (THROTTLE, TIMEOUT, LOST_RESPONSE):
                raise ValueError(f"unknown fault {kind!r}")
        with self._lock:
            self._forced.extend(kinds)

    def _draw(self, write: bool) -> str | None:
        with self._lock:
            if write and self._forced:
                forced = self._forced.popleft()
                self.faults[forced] += 1
                return forced
            if not self.enabled:
                return None
            roll = self._rng.random()
        rates = self.rates
        kind: str | None = None
        if roll < rates.throttle:
            kind = THROTTLE
        elif write and roll < rates.throttle + rates.timeout:
            kind = TIMEOUT
        elif write and roll < rates.throttle + rates.timeout + rates.lost_response:
            kind = LOST_RESPONSE
        if kind is not None:
            with self._lock:
                self.faults[kind] += 1
        return kind

    def _count(self, call: str) -> None:
        with self._lock:
            self.calls[call] += 1

    # -- the port ----------------------------------------------------------------------------

    def get(self, name: str) -> OpRecord | None:
        self._count("get")
        if self._draw(write=False) == THROTTLE:
            raise StoreUnavailableError("chaos: throttled (read)")
        return self.inner.get(name)

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        self._count("put_if_absent")
        return self._write(record, None)

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        self._count("replace_if_version")
        return self._write(record, expected_version)

    def _write(self, record: OpRecord, expected_version: int | None) -> WriteOutcome:
        fault = self._draw(write=True)
        if fault == THROTTLE:
            raise StoreUnavailableError("chaos: throttled (write)")
        if fault == TIMEOUT:
            time.sleep(self.timeout_pause_s)
            raise StoreUnavailableError("chaos: timed out before the write")
        if expected_version is None:
            outcome = self.inner.put_if_absent(record)
        else:
            outcome = self.inner.replace_if_version(record, expected_version)
        if outcome.ok:
            with self._lock:
                self.landed[record.name] += 1
        if fault == LOST_RESPONSE:
            raise StoreUnavailableError("chaos: the write went through but the response was lost")
        return outcome
