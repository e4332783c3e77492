"""The reconciler's re-drive: a lost trigger is not a lost result.

Each reconcile run asks the store whether any archive is due (``iter_archive_due``: terminal
records without a status, or ``pending`` / ``failed`` whose time has come), or else any retry
step (``iter_retry_due``: a lineage of ``opstate.retry`` with work due), and, when one is and
time is left in its budget, hands the work to the archiver: in AWS an asynchronous invocation
of ``OPSTATE_ARCHIVER_FUNCTION`` (the archiver takes every due archive, soonest first, with its
own role and budget); elsewhere nothing (``opstate serve`` and ``opstate archive --once`` run
the pass themselves).

The reconciler's Lambda entry looks through a ``Cadence`` (issue 48: 8 Queries a run, almost
always on empty shards, were two thirds of a warm run's DynamoDB calls): after a look that found
nothing due, the next look is ``REDRIVE_EVERY_S`` later (the first run of a new container looks
at once); after a look that found work (or failed), the next run looks again. So a due archive
or retry step waits at most ``REDRIVE_EVERY_S`` plus one run interval for the re-drive (20
minutes at the defaults), before only one run interval: a finished job still reaches the
archiver at once through the table's stream, the primary path.

It also says when a due archive is at risk: not archived yet, its deadline less than the warning
margin (``results_warn_s``) away (``ResultsAtRisk``, the metric the archiver counts for a copy
failing that late, and one error line). The archiver counts only what it attempted; a result no
archiver has picked up yet (a lost trigger, an archiver that cannot start) is counted here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from opstate.config import Settings
from opstate.domain.times import NS_PER_SECOND, format_time
from opstate.observability import count, log_fields, logger
from opstate.outcomes.plan import deadline_ns, is_cloud_job
from opstate.store.port import (
    ArchiveEntry,
    ArchivingStore,
    RetryableError,
    RetryingStore,
    Store,
)

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient

Invoke = Callable[[str, bytes], None]

# After an empty look, the re-drive looks again this long after (``Cadence``).
REDRIVE_EVERY_S = 900.0


class Cadence:
    """When the re-drive looks: at once, then ``every_s`` after a look that found nothing due;
    a look that found work or failed is followed by one at the next run. Kept in process
    memory (a Lambda container's): a new container looks at once."""

    def __init__(self, every_s: float = REDRIVE_EVERY_S) -> None:
        self.every_ns = int(every_s * NS_PER_SECOND)
        self._next_ns: int | None = None

    def due(self, now_ns: int) -> bool:
        return self._next_ns is None or now_ns >= self._next_ns

    def looked(self, now_ns: int, *, quiet: bool) -> None:
        """``quiet``: the look found nothing due (else the next run looks again)."""
        self._next_ns = now_ns + self.every_ns if quiet else None


def _lambda_invoke(function: str, payload: bytes) -> None:
    import boto3

    client: LambdaClient = boto3.session.Session().client("lambda")
    client.invoke(FunctionName=function, InvocationType="Event", Payload=payload)


def redrive(
    store: Store,
    settings: Settings,
    *,
    remaining_s: Callable[[], float] | None = None,
    invoke: Invoke | None = None,
    clock_ns: Callable[[], int] = time.time_ns,
    cadence: Cadence | None = None,
) -> bool:
    """Invoke the archiver when an archive is due; True when it was invoked. Never raises for
    a store or invocation fault (the next run tries again). ``cadence``: look only when it
    says so (None: every call looks)."""
    function = settings.archiver_function
    if not function or not isinstance(store, ArchivingStore):
        return False
    if remaining_s is not None and remaining_s() < settings.reconcile_safety_margin_s:
        return False
    now = clock_ns()
    if cadence is not None and not cadence.due(now):
        return False
    try:
        entries = list(store.iter_archive_due(now))
        first = entries[0].record.name if entries else _retry_due(store, now)
    except RetryableError as exc:
        log_fields(logger.warning, "archive re-drive skipped", {"error": str(exc)[:200]})
        return False
    if cadence is not None:
        cadence.looked(now, quiet=first is None)
    if first is None:
        return False
    report_at_risk(entries, settings, now)
    payload = json.dumps({"source": "gemini-opstate.reconcile", "first": first})
    try:
        (invoke or _lambda_invoke)(function, payload.encode())
    except Exception as exc:  # one missed re-drive: the next run tries again
        log_fields(logger.error, "archive re-drive failed", {"error": str(exc)[:200]})
        return False
    log_fields(logger.info, "archive re-driven", {"first": first})
    return True


def _retry_due(store: Store, now_ns: int) -> str | None:
    """The first root whose retry step is due (``opstate.retry``: a child to create again, a
    pending timeout, a lineage to finish), or None: the archiver's pass runs the retry pass
    after the archive pass."""
    if not isinstance(store, RetryingStore):
        return None
    for record, _ in store.iter_retry_due(now_ns):
        return record.name
    return None


def _deadline_ns(entry: ArchiveEntry, settings: Settings) -> int:
    stored = entry.archive.deadline_ns if entry.archive is not None else 0
    return deadline_ns(entry.record, stored, settings.results_retention_s)


def at_risk(entries: list[ArchiveEntry], settings: Settings, now_ns: int) -> list[ArchiveEntry]:
    """The due entries whose results Gemini deletes within the warning margin (not yet past:
    those the archiver marks expired and announces lost). Google Cloud jobs are never copied."""
    margin = int(settings.results_warn_s * NS_PER_SECOND)
    return [
        entry
        for entry in entries
        if not is_cloud_job(entry.record.name)
        and now_ns < _deadline_ns(entry, settings) <= now_ns + margin
    ]


def report_at_risk(entries: list[ArchiveEntry], settings: Settings, now_ns: int) -> int:
    """Count (``ResultsAtRisk``) and log the entries ``at_risk``; how many there were."""
    risky = at_risk(entries, settings, now_ns)
    if risky:
        count("ResultsAtRisk", len(risky))
        first = risky[0]
        log_fields(
            logger.error,
            "results at risk",
            {
                "count": len(risky),
                "first": first.record.name,
                "status": first.archive.status if first.archive is not None else None,
                "deadline": format_time(_deadline_ns(first, settings)),
            },
        )
    return len(risky)
