"""Registering a waiter and resuming the waiters of one operation.

``Registrar.register`` keeps a waiter (bounded, idempotent by its id). ``Resumer.resume(name)``
reads the waiters of ``name``, decides each one's condition on the record as stored now, and
resumes the ones whose condition holds: once per call, safe to repeat (a waiter is removed only
after its task answered; a repeat finds the task already done, which ends the waiter as gone).
Throttling and 5xx are retried with jittered exponential backoff, a few times; what still fails
is left registered and reported in the tally (``retry_later``) so the trigger delivers again.
Both are given the kinds of waiter that are enabled (``opstate.waiters.enabled``): a waiter of
any other kind is refused at registration and never sent by the resumer (it ends as gone).
Nothing here writes the record: the record store is only read.

``when: final`` (issue 33) is decided on the root's retry state too. In AWS the bus event
``Operation Results Final`` triggers the resumer Lambda like ``Operation Results Archived``
does; ``opstate serve`` hands a root whose final result its retry pass wrote to its local
waiters (``on_final``); any other runner without a bus calls ``resume_after_final``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opstate.domain.model import OpRecord
from opstate.observability import count, log_fields, logger
from opstate.store.port import Store
from opstate.waiters.enabled import NOT_ENABLED_CODE, TargetNotEnabledError
from opstate.waiters.model import (
    PENDING,
    Failure,
    Status,
    Success,
    Target,
    Verdict,
    Waiter,
    When,
    decide,
)
from opstate.waiters.port import (
    ARCHIVING_UNAVAILABLE,
    CallbackGoneError,
    CallbackRetryableError,
    Callbacks,
    ResultsReader,
    WaiterStore,
)

# What a resume attempt ended as (the ``outcome`` dimension of ``WaitersResumed``).
OUTCOMES = ("succeeded", "failed", "gone", "retry-later")
DEFAULT_ATTEMPTS = 4
DEFAULT_BASE_DELAY_S = 0.2


class ArchivingUnavailableError(Exception):
    """``when: archived`` in a build without results archiving."""

    def __init__(self) -> None:
        super().__init__(ARCHIVING_UNAVAILABLE)


def store_status(store: Store, results: ResultsReader | None) -> Callable[[str, bool], Status]:
    """A status reader over ``store``: the record (consistent read), its lost mark (when the
    store keeps poll states: ``poll_state``) and, when asked, the results view (when a reader
    is given) and the retry state (when the store keeps them: ``get_retry``)."""

    def read(name: str, with_results: bool) -> Status:
        record: OpRecord | None = store.get(name)
        lost_ns = 0
        if record is not None and not record.terminal:
            poll_state = getattr(store, "poll_state", None)
            poll = poll_state(name) if poll_state is not None else None
            lost_ns = poll.lost_ns if poll is not None else 0
        view = results(name) if with_results and results is not None and record else None
        retry = None
        get_retry = getattr(store, "get_retry", None) if with_results and record else None
        if get_retry is not None:
            state = get_retry(name)
            retry = state.as_dict() if state is not None else None
        return Status(record=record, lost_ns=lost_ns, results=view, retry=retry)

    return read


class Registrar:
    """Keeps waiters: at most ``limit`` per operation; only of the kinds in ``targets`` (none
    by default: ``TargetNotEnabledError``); ``archiving`` False refuses ``when: archived`` and
    ``when: final`` (``ArchivingUnavailableError``; without retries final is archived) instead
    of keeping a waiter that could never fire."""

    __slots__ = ("archiving", "limit", "targets", "waiters")

    def __init__(
        self,
        waiters: WaiterStore,
        *,
        limit: int,
        archiving: bool,
        targets: frozenset[Target] = frozenset(),
    ) -> None:
        self.waiters = waiters
        self.limit = limit
        self.archiving = archiving
        self.targets = targets

    def check(self, waiter: Waiter) -> None:
        """Refuse, before anything is written, a waiter this deployment cannot serve."""
        if waiter.target not in self.targets:
            raise TargetNotEnabledError(waiter.target)
        if waiter.when.reads_results and not self.archiving:
            raise ArchivingUnavailableError

    def register(self, waiter: Waiter) -> bool:
        """Keep ``waiter``; False when it was already kept. Raises ``TooManyWaitersError``,
        ``WaiterStoreUnavailableError``, ``TargetNotEnabledError`` or
        ``ArchivingUnavailableError``."""
        self.check(waiter)
        added = self.waiters.add(waiter, self.limit)
        if added:
            count("WaitersRegistered")
        log_fields(
            logger.info,
            "waiter registered" if added else "waiter already registered",
            {"name": waiter.name, "waiter_id": waiter.waiter_id, "when": str(waiter.when)},
        )
        return added


@dataclass
class ResumeTally:
    """What one ``resume`` did: waiter ids by outcome, and how many are still pending."""

    outcomes: dict[str, list[str]] = field(default_factory=lambda: {o: [] for o in OUTCOMES})
    pending: int = 0

    @property
    def retry_later(self) -> list[str]:
        return self.outcomes["retry-later"]


class Resumer:
    """Resumes the waiters of one operation whose condition holds (see the module docstring);
    ``callbacks`` are called only for the kinds in ``targets`` (none by default)."""

    def __init__(
        self,
        waiters: WaiterStore,
        status: Callable[[str, bool], Status],
        callbacks: Callbacks,
        *,
        targets: frozenset[Target] = frozenset(),
        attempts: int = DEFAULT_ATTEMPTS,
        base_delay_s: float = DEFAULT_BASE_DELAY_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.waiters = waiters
        self.status = status
        self.callbacks = callbacks
        self.targets = targets
        self.attempts = attempts
        self.base_delay_s = base_delay_s
        self.sleep = sleep

    def resume(self, name: str) -> ResumeTally:
        tally = ResumeTally()
        waiting = self.waiters.list(name)
        if not waiting:
            return tally
        status = self.status(name, any(w.when.reads_results for w in waiting))
        for waiter in waiting:
            verdict = decide(waiter.when, status)
            if verdict is PENDING:
                tally.pending += 1
                continue
            if waiter.target in self.targets:
                outcome, code = self._deliver(waiter, verdict)
            else:  # never answered with our rights: registered before the kind was disabled
                outcome, code = "gone", NOT_ENABLED_CODE
            tally.outcomes[outcome].append(waiter.waiter_id)
            if outcome != "retry-later":
                self.waiters.remove(name, waiter.waiter_id)
            count("WaitersResumed", outcome=outcome)
            level = logger.warning if outcome in ("gone", "retry-later") else logger.info
            log_fields(
                level,
                "waiter " + outcome,
                {"name": name, "waiter_id": waiter.waiter_id, "code": code},
            )
        return tally

    def _send(self, waiter: Waiter, verdict: Verdict) -> str:
        if isinstance(verdict, Success):
            self.callbacks.succeed(waiter, verdict.output)
            return "succeeded"
        assert isinstance(verdict, Failure)
        self.callbacks.fail(waiter, verdict.error, verdict.cause)
        return "failed"

    def _deliver(self, waiter: Waiter, verdict: Verdict) -> tuple[str, str | None]:
        """(outcome, the service's error code if any), after at most ``attempts`` calls."""
        code: str | None = None
        for attempt in range(self.attempts):
            if attempt:
                self.sleep(random.uniform(0, self.base_delay_s * 2 ** (attempt - 1)))
            try:
                return self._send(waiter, verdict), None
            except CallbackGoneError as exc:
                return "gone", exc.code
            except CallbackRetryableError as exc:
                code = str(exc)
        return "retry-later", code


def resume_after_final(resumer: Resumer | None, root: str) -> ResumeTally | None:
    """Resume the waiters of ``root`` after the retry engine wrote its final result (the
    retry state's ``doc.final.status`` became ``final``): ``when: final`` waiters succeed with
    ``{record, results, final}``. Call it after the write succeeded, with the root's name;
    safe to repeat (a resumed waiter is gone). None when no resumer is given (waiters off).
    The archiver needs no such call in AWS, nor the engine: their writes reach the resumer as
    bus events through the notifier; this is for a runner with no bus (``opstate serve``)."""
    if resumer is None:
        return None
    return resumer.resume(root)


# ``opstate wait`` reads the store at most this often: a few times a second, never a busy loop.
WAIT_POLL_INTERVAL_S = 0.25


def wait_until(
    status: Callable[[str, bool], Status],
    name: str,
    when: When,
    *,
    timeout_s: float | None,
    interval_s: float = WAIT_POLL_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Verdict, Status] | None:
    """Read ``name``'s status every ``interval_s`` until ``when``'s condition holds (the
    verdict and the status it was decided on) or ``timeout_s`` passed (None). Any writer
    (another process, the local server, a replay, the reconciler) is seen at the next read."""
    deadline = None if timeout_s is None else clock() + timeout_s
    while True:
        current = status(name, when.reads_results)
        verdict = decide(when, current)
        if verdict is not PENDING:
            return verdict, current
        if deadline is not None:
            left = deadline - clock()
            if left <= 0:
                return None
            sleep(min(interval_s, left))
        else:
            sleep(interval_s)
