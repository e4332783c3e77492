"""The lanes of a run: one per backend, so a slow or refused backend never holds up the other.

Gemini API records (``gemini-api``) and Google Cloud records (``projects/...``,
``names.backend_of``) each go through their own ``Lane``: what fetches a record, its rate
limit (``reconcile_max_rps`` / ``google_cloud_max_rps``), its shared backoff and breaker, and
whether its credentials were refused this run (then it makes no more requests). ``NoCloud`` is
the Cloud side of a deployment with no Google Cloud configuration.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.names import Backend
from opstate.reconcile.gateway import AuthError, Listed
from opstate.reconcile.pacing import Backoff, Clock, Throttle, TokenBucket


class NoCloud:
    """The Cloud side of a deployment with no Google Cloud configuration: never a request."""

    scopes: tuple[tuple[str, str], ...] = ()

    def batch_pages(self, scope: tuple[str, str], page_size: int) -> Iterator[list[Listed]]:
        return iter(())

    def fetch(self, record: OpRecord) -> OpEvent:
        raise AuthError(
            "Google Cloud is not configured (set OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN or "
            "GOOGLE_APPLICATION_CREDENTIALS; docs/google-cloud.md)"
        )


class Lane:
    """One backend of a run: what fetches its records, its rate limit, backoff and breaker,
    and whether its credentials were refused (then it makes no more requests this run)."""

    def __init__(
        self,
        backend: Backend,
        fetch: Callable[[OpRecord], OpEvent],
        rate: float,
        backoff: Backoff,
        clock: Clock,
    ) -> None:
        self.backend = backend
        self.fetch = fetch
        self.bucket = TokenBucket(rate, clock)
        self.throttle = Throttle(backoff, clock)
        self._refused = False
        self._lock = threading.Lock()

    @property
    def refused(self) -> bool:
        with self._lock:
            return self._refused

    def refuse(self) -> bool:
        """Mark the lane refused; True the first time (the caller reports it once)."""
        with self._lock:
            first = not self._refused
            self._refused = True
            return first
