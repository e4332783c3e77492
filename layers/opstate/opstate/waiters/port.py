"""The waiters' ports: where waiters are kept, what resumes them, what the condition reads.

- ``WaiterStore``: waiters by operation, bounded per operation; never the record's table row,
  version or idempotency keys (DynamoDB: a table of its own; SQLite: a table of its own in the
  store's file; memory: a dict).
- ``Callbacks``: resume one waiter (Step Functions ``SendTaskSuccess`` / ``SendTaskFailure``,
  Lambda durable ``SendDurableExecutionCallbackSuccess`` / ``Failure``). Raises
  ``CallbackGoneError`` when the waiter can never be resumed (the task timed out, does not
  exist, the token is invalid or refused) and ``CallbackRetryableError`` for throttling, 5xx
  and connection faults.
- ``StatusReader``: the record, its lost mark and the results view of one name.
- ``ResultsReader``: the results view (``opstate results --json``) of one name, or None when no
  archive status is known. The outcomes work provides it (``results_json``); a build without it
  has none, and ``when: archived`` is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from opstate.store.port import RetryableError
from opstate.waiters.model import Status, Waiter

ARCHIVING_UNAVAILABLE = "results archiving is not available in this build"

ResultsReader = Callable[[str], Mapping[str, Any] | None]
StatusReader = Callable[[str], Status]


class TooManyWaitersError(Exception):
    """The operation already has the most waiters allowed (``OPSTATE_MAX_WAITERS``)."""


class WaiterStoreUnavailableError(RetryableError):
    """The waiter store could not be reached (throttling, timeout, 5xx): retry later."""


class CallbackGoneError(Exception):
    """The waiter can never be resumed: its task timed out, does not exist, its token is
    invalid, or the call was refused for good. ``code`` is the service's error code."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class CallbackRetryableError(Exception):
    """Throttling, a 5xx or a connection fault: the same call may succeed later."""


@runtime_checkable
class WaiterStore(Protocol):
    """Waiters by operation name."""

    def add(self, waiter: Waiter, limit: int) -> bool:
        """Keep ``waiter``: True when added, False when that waiter (same id) is already kept.
        Raises ``TooManyWaitersError`` when ``name`` already has ``limit`` waiters."""
        ...

    def list(self, name: str) -> Sequence[Waiter]:
        """The waiters of ``name``, oldest first."""
        ...

    def remove(self, name: str, waiter_id: str) -> None:
        """Forget one waiter (no error if it is already gone)."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...


class Callbacks(Protocol):
    """Resumes one waiter."""

    def succeed(self, waiter: Waiter, output: Mapping[str, Any]) -> None: ...

    def fail(self, waiter: Waiter, error: str, cause: str) -> None: ...
