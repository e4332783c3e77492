"""The reconciler's re-drive: a lost trigger is not a lost result.

Each reconcile run asks the store whether any archive is due (``iter_archive_due``: terminal
records without a status, or ``pending`` / ``failed`` whose time has come) and, when one is and
time is left in its budget, hands the work to the archiver: in AWS an asynchronous invocation
of ``OPSTATE_ARCHIVER_FUNCTION`` (the archiver takes every due archive, soonest first, with its
own role and budget); elsewhere nothing (``opstate serve`` and ``opstate archive --once`` run
the pass themselves).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from opstate.config import Settings
from opstate.observability import log_fields, logger
from opstate.store.port import ArchivingStore, RetryableError, Store

Invoke = Callable[[str, bytes], None]


def _lambda_invoke(function: str, payload: bytes) -> None:
    import boto3

    client: Any = boto3.session.Session().client("lambda")
    client.invoke(FunctionName=function, InvocationType="Event", Payload=payload)


def redrive(
    store: Store,
    settings: Settings,
    *,
    remaining_s: Callable[[], float] | None = None,
    invoke: Invoke | None = None,
    clock_ns: Callable[[], int] = time.time_ns,
) -> bool:
    """Invoke the archiver when an archive is due; True when it was invoked. Never raises for
    a store or invocation fault (the next run tries again)."""
    function = settings.archiver_function
    if not function or not isinstance(store, ArchivingStore):
        return False
    if remaining_s is not None and remaining_s() < settings.reconcile_safety_margin_s:
        return False
    try:
        due = next(iter(store.iter_archive_due(clock_ns())), None)
    except RetryableError as exc:
        log_fields(logger.warning, "archive re-drive skipped", {"error": str(exc)[:200]})
        return False
    if due is None:
        return False
    payload = json.dumps({"source": "gemini-opstate.reconcile", "first": due.record.name})
    try:
        (invoke or _lambda_invoke)(function, payload.encode())
    except Exception as exc:  # one missed re-drive: the next run tries again
        log_fields(logger.error, "archive re-drive failed", {"error": str(exc)[:200]})
        return False
    log_fields(logger.info, "archive re-driven", {"first": due.record.name})
    return True
