"""One event into the store for a route: ``ingest`` with the API's answers to its failures
(503 on contention or an unavailable store), the decision logged, counted and handed on."""

from __future__ import annotations

from collections.abc import Callable

from opstate.api.errors import RETRY_AFTER_CONTENTION_S, ApiError, unavailable
from opstate.domain.model import Decision, OpEvent
from opstate.ingest import IngestContentionError, ingest_counted
from opstate.observability import logger, record_decision, record_retry_later
from opstate.store.port import RetryableError, Store


class Ingester:
    """Applies events to ``store``; ``on_decision`` sees every decision taken (its failures are
    logged, never the caller's)."""

    # A plain class, not a dataclass: building one costs the webhook's cold start a millisecond.
    __slots__ = ("clock_ns", "max_attempts", "on_decision", "store")

    def __init__(
        self,
        store: Store,
        max_attempts: int,
        clock_ns: Callable[[], int],
        on_decision: Callable[[Decision], None] | None = None,
    ) -> None:
        self.store = store
        self.max_attempts = max_attempts
        self.clock_ns = clock_ns
        self.on_decision = on_decision

    def __call__(self, event: OpEvent, **context: object) -> Decision:
        """The decision on ``event``; ``context`` (e.g. ``webhook_id``) goes into the logs."""
        try:
            done = ingest_counted(
                self.store, event, max_attempts=self.max_attempts, clock_ns=self.clock_ns
            )
        except IngestContentionError as exc:
            record_retry_later("gave-up", str(exc), name=event.name, **context)
            raise ApiError(
                503,
                "retry-later",
                "too many concurrent updates to this operation; retry later",
                {"Retry-After": str(RETRY_AFTER_CONTENTION_S)},
            ) from None
        except RetryableError as exc:
            raise unavailable(exc, name=event.name, **context) from None
        decision = done.decision
        record_decision(decision, attempts=done.attempts, conflicts=done.conflicts, **context)
        if self.on_decision is not None:
            try:
                self.on_decision(decision)
            except Exception:
                logger.exception("on_decision callback failed", extra={"operation": event.name})
        return decision
