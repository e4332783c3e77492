"""Waiters inside ``opstate serve``: registration on the operations route, and resuming on a
worker thread after every state change the server sees (the API's decisions and the local
reconciler's, lost marks included) and after each registration.

Resumes go through the AWS callbacks (boto3: point ``AWS_ENDPOINT_URL_SFN`` at Step Functions
Local or a moto server). A resume that must be retried (throttling, 5xx, no endpoint) stays
registered and is tried again on the operation's next change or the next registration; the
server never fails a request for it.

The same rule as in AWS: a kind of waiter is enabled only when its ARNs are set
(``OPSTATE_WAITER_STATE_MACHINE_ARNS``, ``OPSTATE_WAITER_DURABLE_FUNCTION_ARNS``;
``opstate.waiters.enabled``). Here nothing enforces the list itself: the credentials boto3
finds are what restrict which tasks can be answered.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING

from opstate.config import Settings
from opstate.domain.model import Decision
from opstate.observability import logger
from opstate.waiters.wiring import registrar_for, resumer_for, waiter_store_for

if TYPE_CHECKING:
    from opstate.reconcile.tally import RunDecision
    from opstate.store.port import Store
    from opstate.waiters.run import Registrar


class LocalWaiters:
    """The local server's registrar and a resumer on one worker thread."""

    def __init__(self, store: Store, settings: Settings) -> None:
        waiters = waiter_store_for(store, settings)
        self.registrar: Registrar | None = registrar_for(waiters, settings)
        self._resumer = resumer_for(store, waiters, settings) if waiters is not None else None
        self._names: queue.Queue[str | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def soon(self, name: str) -> None:
        """Resume the waiters of ``name`` whose condition holds, on the worker thread."""
        if self._resumer is None:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="waiters", daemon=True)
            self._thread.start()
        self._names.put(name)

    def after(self, decision: RunDecision) -> None:
        """After a decision: an applied terminal state or a mark may end a wait."""
        if isinstance(decision, Decision):
            if decision.applied and decision.record is not None and decision.record.terminal:
                self.soon(decision.event.name)
        else:
            self.soon(decision.record.name)

    def _work(self) -> None:
        assert self._resumer is not None
        while (name := self._names.get()) is not None:
            try:
                self._resumer.resume(name)
            except Exception as exc:  # a resume never takes the server down
                logger.warning("waiters: resume failed", extra={"error_type": type(exc).__name__})

    def stop(self) -> None:
        if self._thread is not None:
            self._names.put(None)
            self._thread.join(timeout=5)
