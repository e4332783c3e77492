"""Waiters, pure: what a registration says, and what a waiter's condition decides.

No I/O, no clock: ``parse_waiter`` turns the ``"waiter"`` object of a ``PUT /operations/{name}``
body into a ``Waiter``; ``decide`` takes a waiter's condition, the record (and whether it is
lost), the results view and the retry state, and answers ``PENDING``, a ``Success`` (the task's
output) or a ``Failure`` (error and cause). ``opstate wait`` and the resumer share it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.domain.strict_json import dumps
from opstate.domain.times import format_time
from opstate.domain.views import record_to_json


class When(StrEnum):
    """When a waiter is resumed: the state is terminal, the results are archived, or the final
    result of a root and its retries is written (issue 33)."""

    TERMINAL = "terminal"
    ARCHIVED = "archived"
    FINAL = "final"

    @property
    def reads_results(self) -> bool:
        """Whether the condition reads the results view (and the retry state)."""
        return self is not When.TERMINAL


class Target(StrEnum):
    """What is resumed, and the body key that names it."""

    STEP_FUNCTIONS = "stepFunctionsTaskToken"
    LAMBDA_DURABLE = "lambdaDurableCallbackId"


# Step Functions: a task token is 1..1024 characters; a Lambda durable callback id 1..1024 too.
MAX_TOKEN_LENGTH: Final = 1024
# SendTaskFailure: error up to 256 characters, cause up to 32768.
MAX_ERROR_LENGTH: Final = 256
MAX_CAUSE_LENGTH: Final = 32768
# Archive statuses (the outcomes work): the ones that end an ``archived`` wait.
RESULTS_DONE: Final = frozenset({"archived", "none"})
RESULTS_EXPIRED: Final = "expired"
LOST_ERROR: Final = "LOST"
# The DynamoDB waiter store's per-operation counter item (its sort key; waiter ids are hex).
COUNTER_ID: Final = "#count"
RESULTS_EXPIRED_ERROR: Final = "RESULTS_EXPIRED"
# Retry statuses (``opstate.store.retry_state``) under which a root's final result is awaited.
RETRY_ROOT_STATUSES: Final = frozenset({"active", "done"})
RETRY_ACTIVE: Final = "active"
FINAL_STATUS: Final = "final"


class InvalidWaiterError(ValueError):
    """The ``waiter`` object of a request is not one this system accepts."""


@dataclass(frozen=True, slots=True)
class Waiter:
    """One registered waiter. ``token`` is a secret: never in a ``repr``, a log or a view;
    ``waiter_id`` (a hash of target and token) names it instead, and makes registering the
    same token again a no-op."""

    name: str
    target: Target
    token: str = field(repr=False)
    when: When = When.TERMINAL
    created_ns: int = 0

    @property
    def waiter_id(self) -> str:
        return waiter_id(self.target, self.token)


def waiter_id(target: Target, token: str) -> str:
    """A stable, non-secret id: the first 128 bits of sha256(target, token), hex."""
    return hashlib.sha256(f"{target}\0{token}".encode()).hexdigest()[:32]


def _token(body: Mapping[str, Any]) -> tuple[Target, str]:
    given = [t for t in Target if t.value in body]
    if len(given) != 1:
        keys = " or ".join(f"'{t.value}'" for t in Target)
        raise InvalidWaiterError(f"a waiter names exactly one of {keys}")
    target = given[0]
    token = body[target.value]
    if not isinstance(token, str) or not token.strip():
        raise InvalidWaiterError(f"'{target.value}' must be a non-empty string")
    if len(token) > MAX_TOKEN_LENGTH or not token.isprintable():
        # The value itself is never echoed: it is a secret.
        raise InvalidWaiterError(
            f"'{target.value}' must be at most {MAX_TOKEN_LENGTH} printable characters"
        )
    return target, token


def parse_waiter(name: str, body: object, *, now_ns: int) -> Waiter:
    """The waiter ``body`` registers on operation ``name`` (its canonical key)."""
    if not isinstance(body, Mapping):
        raise InvalidWaiterError("'waiter' must be a JSON object")
    unknown = sorted(set(body) - {t.value for t in Target} - {"when"})
    if unknown:
        raise InvalidWaiterError(f"unknown waiter field(s): {', '.join(map(repr, unknown))}")
    target, token = _token(body)
    raw_when = body.get("when", When.TERMINAL.value)
    try:
        when = When(raw_when)
    except ValueError:
        raise InvalidWaiterError(
            f"'when' must be 'terminal', 'archived' or 'final', not {str(raw_when)[:40]!r}"
        ) from None
    return Waiter(name=name, target=target, token=token, when=when, created_ns=now_ns)


# -- the condition --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Success:
    """Resume with ``output`` (``{record, results}``, and ``final`` for ``when: final``)."""

    output: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Failure:
    """Resume as failed: ``error`` (a state or condition) and ``cause`` (short JSON)."""

    error: str
    cause: str


class _Pending:
    __slots__ = ()

    def __repr__(self) -> str:
        return "PENDING"


PENDING: Final = _Pending()
Verdict = Success | Failure | _Pending


@dataclass(frozen=True, slots=True)
class Status:
    """What the condition looks at: the record (None: not tracked), whether the reconciler
    marked it lost (and when), the results view (None: no archive status known) and the retry
    state's stored form (``RetryState.as_dict()``: ``{status, created_ns, rev, due_ns, doc}``;
    None: the record has none)."""

    record: OpRecord | None
    lost_ns: int = 0
    results: Mapping[str, Any] | None = None
    retry: Mapping[str, Any] | None = None


def results_status(results: Mapping[str, Any] | None) -> str | None:
    """The archive status a results view carries (``status``), if any."""
    if results is None:
        return None
    status = results.get("status")
    return status if isinstance(status, str) else None


def _cause(record: OpRecord, **extra: object) -> str:
    """A short JSON cause: the record's identity, state and time, its error details if any."""
    cause: dict[str, Any] = {
        "name": record.name,
        "state": str(record.state),
        "version": record.version,
        "updateTime": format_time(record.update_time_ns) if record.update_time_ns else None,
    }
    for key in ("error_code", "error_message", "error"):
        if key in record.details:
            value = record.details[key]
            cause[key] = value[:1000] if isinstance(value, str) else value
    cause.update({k: v for k, v in extra.items() if v is not None})
    text = dumps(cause, compact=True)
    if len(text) > MAX_CAUSE_LENGTH:  # details are clipped above; this is the last resort
        text = dumps({k: cause[k] for k in ("name", "state", "version")}, compact=True)
    return text


def _terminal(status: Status, record: OpRecord) -> Verdict:
    if record.state is State.SUCCEEDED:
        return Success({"record": record_to_json(record), "results": None})
    return Failure(str(record.state), _cause(record))


def _archived(status: Status, record: OpRecord) -> Verdict:
    archive = results_status(status.results)
    results = dict(status.results or {})
    if archive == RESULTS_EXPIRED:
        return Failure(RESULTS_EXPIRED_ERROR, _cause(record, results=results))
    if archive in RESULTS_DONE:
        if record.state is State.SUCCEEDED:
            return Success({"record": record_to_json(record), "results": results})
        return Failure(str(record.state), _cause(record, results=results))
    if archive is None and record.state is not State.SUCCEEDED:
        # Failed or cancelled and no archive status at all: nothing will be archived for it.
        return Failure(str(record.state), _cause(record))
    return PENDING  # pending, or failed (re-driven until archived or expired)


def final_of(retry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The final view (``opstate.domain.retry.final_view``: ``status``, ``location``, ``rows``,
    ``errors``, ``attempts``) of a root's retry state once its final result is written
    (``doc.final.status == "final"``), else None (no retry state, a child's, not final yet)."""
    if retry is None or retry.get("status") not in RETRY_ROOT_STATUSES:
        return None
    doc = retry.get("doc")
    final = doc.get("final") if isinstance(doc, Mapping) else None
    if not isinstance(final, Mapping) or final.get("status") != FINAL_STATUS:
        return None
    assert isinstance(doc, Mapping)
    from opstate.domain.retry import final_view  # only once a final result exists

    return final_view(doc)


def _final(status: Status, record: OpRecord) -> Verdict:
    final = final_of(status.retry)
    results = dict(status.results or {})
    if final is not None:
        return Success({"record": record_to_json(record), "results": results, "final": final})
    retry_status = status.retry.get("status") if status.retry is not None else None
    if retry_status == RETRY_ACTIVE and not _room_only(status.retry):
        # Whatever the root's state or its own archive (results lost too: the engine still
        # writes the final result, the lost output's keys as 'missing'): final will come.
        return PENDING
    # No policy (or retries off, unavailable, stopped, or a child): final is archived.
    verdict = _archived(status, record)
    if isinstance(verdict, Success):
        return Success({**verdict.output, "final": None})
    return verdict


def _room_only(retry: Mapping[str, Any] | None) -> bool:
    """An active state that retries nothing: a batch submitted alone kept active only until
    the pass frees its room in the queue (``opstate.retry.solo_room``; a job is never off)."""
    from opstate.domain.retry import retry_view

    doc = retry.get("doc") if retry is not None else None
    return isinstance(doc, Mapping) and retry_view(doc)["status"] == "off"


def decide(when: When, status: Status) -> Verdict:
    """What a waiter with condition ``when`` does now.

    - not tracked, or open and not lost: pending;
    - open and lost: failure ``LOST``;
    - ``terminal``: SUCCEEDED → success ``{record, results: null}``; FAILED / CANCELLED →
      failure with the state as error;
    - ``archived``: after the archive status is ``archived`` or ``none``, success
      ``{record, results}`` for SUCCEEDED (failure with the state otherwise); ``expired`` →
      failure ``RESULTS_EXPIRED``; a failed or cancelled operation with no archive status is
      failed at once; anything else waits;
    - ``final``: once the retry state of the root says its final result is written
      (``doc.final.status == "final"``), success ``{record, results, final}`` whatever the
      root's own state; while its retries are ``active``, it waits (a FAILED root too),
      unless the results expired (``RESULTS_EXPIRED``); with no retry state, or one that
      will never write a final result (retries off, unavailable, stopped; a child), exactly
      ``archived``'s verdict, with ``final: null`` in a success.
    """
    record = status.record
    if record is None:
        return PENDING
    if not record.terminal:
        if status.lost_ns:
            return Failure(LOST_ERROR, _cause(record, lostAt=format_time(status.lost_ns)))
        return PENDING
    if when is When.TERMINAL:
        return _terminal(status, record)
    if when is When.FINAL:
        return _final(status, record)
    return _archived(status, record)
