"""The waiters' wiring: the waiter store a store URL implies, the production resumer, and the
resumer Lambda's event handling (bus events and the waiters table's stream).

In AWS the resumer is triggered by two sources:

- the bus: ``Operation State Changed`` (terminal states), ``Operation Lost``, the outcomes
  work's results events and ``Operation Results Final`` (a root's final result after its
  retries) name the operation whose waiters may now be resumed;
- the waiters table's stream: an ``INSERT`` is a new waiter, resumed at once if its condition
  already holds.

Either way the handler resumes every waiter of the names it was given (reading the record as
stored now, never trusting the event's copy) and fails the invocation when a resume must be
retried, so that Lambda's own retry (async for the bus, the stream's retry for the table)
delivers again; after that the DLQ holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opstate.config import Settings
from opstate.outcomes.results import results_json
from opstate.store import Store
from opstate.store.port import RetryableError
from opstate.waiters.enabled import enabled_targets
from opstate.waiters.memory import MemoryWaiterStore
from opstate.waiters.model import COUNTER_ID
from opstate.waiters.port import Callbacks, ResultsReader, WaiterStore
from opstate.waiters.run import Registrar, Resumer, store_status

# The results view: ``results_json(store, name)`` -> the ``opstate results --json`` dict, or None
# when no archive status is known (``opstate.outcomes.results``). None (a build without results
# archiving, and some tests): ``when: archived`` is refused (API 400, ``opstate wait --until
# archived`` exit 2).
RESULTS_JSON: Callable[[Store, str], Mapping[str, Any] | None] | None = results_json


def results_reader_for(store: Store) -> ResultsReader | None:
    """The results port bound to ``store`` (None in a build without results archiving)."""
    view = RESULTS_JSON
    if view is None:
        return None
    return lambda name: view(store, name)


class ResumeLaterError(RetryableError):
    """Some waiters could not be resumed now (throttling, 5xx): the trigger must deliver
    again. Carries no token: only waiter ids."""


def waiter_store_for(store: Store, settings: Settings) -> WaiterStore | None:
    """The waiter store beside ``store``: the SQLite file's own ``waiters`` table, the
    DynamoDB table ``OPSTATE_WAITERS_TABLE_NAME`` (None when unset: waiters not enabled), a
    ``MemoryWaiterStore`` for a memory store."""
    from opstate.store.memory import MemoryStore

    if isinstance(store, MemoryStore):
        return MemoryWaiterStore()
    path = getattr(store, "path", None)
    if path is not None:
        from opstate.waiters.sqlite import SQLiteWaiterStore

        return SQLiteWaiterStore(path)
    if settings.waiters_table_name:
        from opstate.waiters.dynamodb import DynamoDBWaiterStore

        return DynamoDBWaiterStore(settings.waiters_table_name)
    return None


def registrar_for(waiters: WaiterStore | None, settings: Settings) -> Registrar | None:
    """The registrar over ``waiters``: the kinds of waiter whose ARNs ``settings`` name."""
    if waiters is None:
        return None
    return Registrar(
        waiters,
        limit=settings.max_waiters,
        archiving=RESULTS_JSON is not None,
        targets=enabled_targets(settings),
    )


def resumer_for(
    store: Store, waiters: WaiterStore, settings: Settings, callbacks: Callbacks | None = None
) -> Resumer:
    """The resumer over ``store`` and ``waiters``, answering only the kinds of waiter whose
    ARNs ``settings`` name; AWS callbacks unless ``callbacks`` given."""
    if callbacks is None:
        from opstate.waiters.callbacks import AwsCallbacks

        callbacks = AwsCallbacks()
    return Resumer(
        waiters,
        store_status(store, results_reader_for(store)),
        callbacks,
        targets=enabled_targets(settings),
    )


def names_in(event: Mapping[str, Any]) -> list[str]:
    """The operation names a resumer invocation is about: an EventBridge event's
    ``detail.name`` (``detail.root`` for ``Operation Results Final``); the ``name`` key of
    each ``INSERT`` of a waiters-table stream batch and of each ``MODIFY`` of the operations
    table's stream (an archive settled as ``none`` or
    ``expired`` without a results event: the template's filters let only those through; a
    ``REMOVE`` is never a reason to resume)."""
    detail = event.get("detail")
    if isinstance(detail, Mapping):
        # ``Operation Results Final`` names its operation ``root`` (issue 33).
        name = detail.get("name", detail.get("root"))
        return [name] if isinstance(name, str) else []
    names: list[str] = []
    for record in event.get("Records") or ():
        if not isinstance(record, Mapping):
            continue
        if record.get("eventName") not in ("INSERT", "MODIFY"):
            continue
        keys = (record.get("dynamodb") or {}).get("Keys") or {}
        if (keys.get("waiter_id") or {}).get("S") == COUNTER_ID:
            continue  # the bound's counter, not a waiter
        key = keys.get("name") or {}
        name = key.get("S") if isinstance(key, Mapping) else None
        if isinstance(name, str) and name not in names:
            names.append(name)
    return names


def resume_all(resumer: Resumer, names: Iterable[str]) -> dict[str, int]:
    """Resume the waiters of every name; raises ``ResumeLaterError`` (after all were tried)
    when some must be retried. Returns counts by outcome."""
    totals: dict[str, int] = {}
    later: list[str] = []
    for name in names:
        tally = resumer.resume(name)
        for outcome, ids in tally.outcomes.items():
            totals[outcome] = totals.get(outcome, 0) + len(ids)
        totals["pending"] = totals.get("pending", 0) + tally.pending
        later.extend(tally.retry_later)
    if later:
        raise ResumeLaterError(f"{len(later)} waiter(s) to resume later: {', '.join(later)}")
    return totals


_resumer: Resumer | None = None


def default_resumer() -> Resumer:
    """The resumer the Lambda uses, built once from ``settings()``."""
    global _resumer
    if _resumer is None:
        from opstate.config import settings
        from opstate.store import store_from_url

        config = settings()
        store = store_from_url(config.store_url, config)
        waiters = waiter_store_for(store, config)
        if waiters is None:
            raise RuntimeError("OPSTATE_WAITERS_TABLE_NAME is not set: no waiters to resume")
        _resumer = resumer_for(store, waiters, config)
    return _resumer


def handle(event: Mapping[str, Any], resumer: Resumer | None = None) -> dict[str, Any]:
    """The resumer Lambda: resume the waiters of the names ``event`` is about."""
    names = names_in(event)
    totals = resume_all(resumer or default_resumer(), names)
    return {"names": len(names), **totals}
