"""An in-memory Gemini gateway for the reconciler's run (unit tests, benchmark).

Operations are programmed as a state per name (plus an update time); ``fail(name, error)``
makes the next requests for ``name`` raise; ``missing`` names answer 404. ``requests`` counts
fetches per name. Latency and random 429s are optional (the benchmark's).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from opstate.domain.events import Source
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.states import State
from opstate.reconcile.gateway import GatewayError, Listed, WebhookInfo


@dataclass
class _Op:
    state: State
    update_ns: int


class MemoryGateway:
    def __init__(
        self,
        *,
        on_request: Callable[[str], None] | None = None,
        rate_limited: float = 0.0,
        retry_after_s: float | None = None,
        seed: int = 1,
    ) -> None:
        self._lock = threading.Lock()
        self.ops: dict[str, _Op] = {}
        self.missing: set[str] = set()
        self.faults: dict[str, list[GatewayError]] = {}
        self.hooks: list[WebhookInfo] = []
        self.batch_list: list[str] = []
        self.requests: Counter[str] = Counter()
        self.rate_limited_answers = 0
        self._on_request = on_request
        self._rate_limited = rate_limited
        self._retry_after_s = retry_after_s
        self._random = random.Random(seed)

    def put(self, name: str, state: State, update_ns: int) -> None:
        with self._lock:
            self.ops[name] = _Op(state, update_ns)
            self.missing.discard(name)

    def remove(self, name: str) -> None:
        with self._lock:
            self.ops.pop(name, None)
            self.missing.add(name)

    def fail(self, name: str, *errors: GatewayError) -> None:
        with self._lock:
            self.faults.setdefault(name, []).extend(errors)

    # --- the port ----------------------------------------------------------------------------

    def webhooks(self) -> Sequence[WebhookInfo]:
        return list(self.hooks)

    def batch_pages(self, page_size: int) -> Iterator[Sequence[Listed]]:
        with self._lock:
            names = list(self.batch_list)
        for start in range(0, len(names), page_size):
            page: list[Listed] = []
            for name in names[start : start + page_size]:
                op = self.ops[name]
                page.append((name, OpEvent(name, op.state, op.update_ns, Source.POLL, {})))
            yield page

    def fetch(self, record: OpRecord) -> OpEvent:
        name = record.name
        if self._on_request is not None:
            self._on_request(name)
        with self._lock:
            self.requests[name] += 1
            queued = self.faults.get(name)
            if queued:
                raise queued.pop(0)
            if self._rate_limited and self._random.random() < self._rate_limited:
                self.rate_limited_answers += 1
                raise GatewayError(
                    "429 RESOURCE_EXHAUSTED",
                    status=429,
                    transient=True,
                    retry_after_s=self._retry_after_s,
                )
            op = self.ops.get(name)
            if op is None:
                raise GatewayError(f"404 {name} not found", status=404)
            return OpEvent(name, op.state, op.update_ns, Source.POLL, {})

    def total_requests(self) -> int:
        with self._lock:
            return sum(self.requests.values())
