"""The first two phases of a run: webhook health, then discovery.

- ``check_webhooks``: every webhook not ``enabled`` is an error line; their number is the
  ``WebhooksDisabled`` metric of every run whose listing succeeded (0 included).
- ``discover``: up to ``reconcile_max_pages`` pages of batch jobs from the Gemini API (when
  ``Settings.discovers_all``: ``OPSTATE_DISCOVER``), then as many from each Google Cloud
  scope, every job ingested (a batch made by any tool gets a record). Each listed page is
  read from the store in one batched read (``BatchReadingStore.get_many``); a job whose state
  and time the table already holds is a counted drop with no store call (no log line), a
  changed one goes through ingest with the record read (one conditional write). What it
  read (name -> record after, and the progress listed) lets polling reschedule those entries without
  another request. A refused Cloud lane stops the Cloud listing.
- ``Settled``: the final records a process's listings found (a Lambda container's, kept for
  its next listings): a listed job that drops against one is not read again.
- ``discovery_sentence``: what a pass will discover, said before a local first pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Protocol, cast

from opstate.config import Settings
from opstate.domain.events import EventError, UnsupportedEventError
from opstate.domain.model import Decision, OpEvent, OpRecord
from opstate.domain.reducer import apply_event
from opstate.domain.states import is_terminal
from opstate.ingest import UNKNOWN, Ingested, Unknown
from opstate.observability import count, logger
from opstate.reconcile.gateway import AuthError, GatewayError, Listed
from opstate.reconcile.poll_writer import Discovered, progress_of
from opstate.reconcile.runner import Run
from opstate.store.port import BatchReadingStore, RetryableError

# Batch jobs asked per discovery page (the API caps it; fewer may come back).
DISCOVERY_PAGE_SIZE = 100


def discovery_sentence(settings: Settings) -> str:
    """What a reconcile pass will discover, as ``opstate serve`` and a local ``opstate
    reconcile --once`` say it before their first pass (issue 40)."""
    if settings.reconcile_max_pages <= 0:
        return "discovery: off (OPSTATE_RECONCILE_MAX_PAGES=0): only what is tracked is followed"
    if settings.discovers_all:
        return (
            "discovery: all - every batch this Gemini API key can list is tracked here and "
            "its results archived, also batches this store never submitted "
            "(OPSTATE_DISCOVER=tracked: only what you track, submit or is pushed)"
        )
    return (
        "discovery: tracked - only batches tracked, submitted or pushed here are followed "
        "(OPSTATE_DISCOVER=all: every batch the key can list)"
    )


def check_webhooks(run: Run) -> None:
    if not run.budget.left():
        run.stop("budget")
        return
    try:
        webhooks = run.gateway.webhooks()
    except GatewayError as exc:
        run.error("webhook listing failed", exc.sentence, status=exc.status, error=exc.message)
        return
    disabled = 0
    for webhook in webhooks:
        if webhook.state is None:
            logger.warning("webhook without a state", extra={"webhook_id": webhook.id})
        elif webhook.state != "enabled":
            disabled += 1
            logger.error(
                "webhook not enabled",
                extra={
                    "webhook": webhook.name or webhook.id,
                    "webhook_name": webhook.name,
                    "webhook_id": webhook.id,
                    "webhook_state": webhook.state,
                },
            )
    count("WebhooksDisabled", disabled)


class Pace(Protocol):
    """When the Gemini API's batches are listed (``OPSTATE_DISCOVER=all``): ``due`` before a
    listing, ``looked`` after one (``quiet``: it changed nothing and failed nothing). Met by
    ``opstate.outcomes.redrive.Cadence``, which the AWS wiring passes: a quiet listing is
    followed by the next ``DISCOVER_EVERY_S`` later, any other by one at the next run."""

    def due(self, now_ns: int) -> bool: ...

    def looked(self, now_ns: int, *, quiet: bool) -> None: ...


class Settled:
    """The final records this process's listings found in the store or wrote (issue 48), kept
    for its next listings: a listed job whose answer drops against its kept record is a drop
    with no store read (one ``BatchGetItem`` item a job a listing was most of a quiet
    ``OPSTATE_DISCOVER=all`` day's reads).

    Sound because the store only moves forward: a final record stays final and its time only
    grows, so an answer that drops against the kept record drops against whatever the store
    holds now (the drop's reason is the same: the state cannot change, and an answer not newer
    than the kept time is not newer than a later one). An answer that would apply is read and
    ingested as ever. Kept in process memory (a new container reads everything once), at most
    ``limit`` records, the oldest kept first out. A record the store has since expired (its
    retention) is not listed as new again until the container is.
    """

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = max(0, limit)
        self._records: dict[str, OpRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def dropping(self, event: OpEvent, now_ns: int) -> Decision | None:
        """``event``'s drop against its kept record (None: none kept, or it would apply)."""
        record = self._records.get(event.name)
        if record is None:
            return None
        decision = apply_event(record, event, now_ns=now_ns)
        return None if decision.applied else decision

    def keep(self, record: OpRecord) -> None:
        """Keep a final record the store holds (others are ignored)."""
        if not is_terminal(record.state) or self.limit == 0:
            return
        self._records.pop(record.name, None)
        while len(self._records) >= self.limit:
            del self._records[next(iter(self._records))]
        self._records[record.name] = record


def discover(
    run: Run,
    pool: ThreadPoolExecutor,
    pace: Pace | None = None,
    settled: Settled | None = None,
) -> dict[str, Discovered]:
    """Ingest up to ``reconcile_max_pages`` pages of batch jobs from the Gemini API (when
    ``pace``, None: every run, says so), then as many from each Google Cloud scope; name ->
    record after, and its progress. ``settled``: final records kept from earlier listings
    (and kept for later ones); None: every listed page is read."""
    seen: dict[str, Discovered] = {}
    if run.settings.reconcile_max_pages <= 0:
        return seen
    now = run.clock.now_ns()
    # OPSTATE_DISCOVER (Google Cloud scopes are named ones)
    if run.settings.discovers_all and (pace is None or pace.due(now)):
        before = (run.tally.result.applied, run.tally.result.errors)
        discover_pages(
            run, pool, partial(run.gateway.batch_pages, DISCOVERY_PAGE_SIZE), seen, settled=settled
        )
        if pace is not None:
            after = (run.tally.result.applied, run.tally.result.errors)
            pace.looked(now, quiet=after == before and run.stop_reason is None)
    for scope in run.cloud.scopes:
        if run.stop_reason is not None or run.google_cloud.refused:
            break
        try:
            discover_pages(
                run,
                pool,
                partial(run.cloud.batch_pages, scope, DISCOVERY_PAGE_SIZE),
                seen,
                scope="/".join(scope),
                settled=settled,
            )
        except AuthError as exc:
            run.refused(run.google_cloud, exc, "discover")
    return seen


def discover_pages(
    run: Run,
    pool: ThreadPoolExecutor,
    pages: Callable[[], Iterator[Sequence[Listed]]],
    seen: dict[str, Discovered],
    scope: str | None = None,
    settled: Settled | None = None,
) -> None:
    """One listing's pages into ``seen`` (``AuthError`` escapes, other failures count); the
    final records it finds kept in ``settled``."""
    if not run.budget.left():
        run.stop("budget")
        return
    read = 0
    try:
        for page in pages():
            read += 1
            held = held_of(run, page, settled)
            stored = stored_of(run, [listed for listed in page if listed[0] not in held])
            for name, discovered in pool.map(partial(ingest_job, run, stored, held), page):
                if name is not None:
                    seen[name] = discovered
                    if settled is not None and discovered.record is not None:
                        settled.keep(discovered.record)
            if read >= run.settings.reconcile_max_pages:
                break
            if not run.budget.left():
                run.stop("budget")
                break
    except AuthError:
        raise
    except GatewayError as exc:
        context = {"status": exc.status, "error": exc.message}
        run.error(
            "batch discovery failed",
            exc.sentence,
            **context,
            **({"scope": scope} if scope else {}),
        )


def held_of(run: Run, page: Sequence[Listed], settled: Settled | None) -> dict[str, Decision]:
    """The page's listed jobs (by the name listed) whose answer drops against a final record
    kept from an earlier listing, with that drop: not read from the store again."""
    if settled is None or not len(settled):
        return {}
    now = run.clock.now_ns()
    held: dict[str, Decision] = {}
    for raw_name, answer in page:
        if isinstance(answer, OpEvent):
            drop = settled.dropping(answer, now)
            if drop is not None:
                held[raw_name] = drop
    return held


def stored_of(run: Run, page: Sequence[Listed]) -> dict[str, OpRecord] | None:
    """The stored records of a listed page's jobs, in one batched read (``get_many``; None:
    the store reads one by one). A failed read leaves each job to its own ingest."""
    if not callable(getattr(run.store, "get_many", None)):
        return None
    store = cast(BatchReadingStore, run.store)
    names = [answer.name for _, answer in page if isinstance(answer, OpEvent)]
    if not names:
        return {}
    try:
        return store.get_many(names)
    except RetryableError as exc:
        run.error("batch discovery read failed", name=names[0], error=str(exc))
        return None


def ingest_job(
    run: Run,
    stored: Mapping[str, OpRecord] | None,
    held: Mapping[str, Decision],
    listed: tuple[str, OpEvent | EventError],
) -> tuple[str | None, Discovered]:
    """One listed job: its drop against a kept final record (``held``), or reduced against
    its stored record first when the page's read has it (a job whose state and time the table
    already holds is a drop, counted, with no store call), else through ingest, handed what
    the read found (no second read)."""
    raw_name, answer = listed
    run.tally.add(discovered=1)
    if isinstance(answer, UnsupportedEventError):
        run.unsupported(answer, raw_name, "discover")
        return None, Discovered(None)
    if not isinstance(answer, EventError):
        answer = run.skewed(answer)
    if isinstance(answer, EventError):
        run.error("batch job refused", name=raw_name, code=answer.code, error=answer.message)
        return None, Discovered(None)
    drop = held.get(raw_name)
    known: OpRecord | Unknown | None = UNKNOWN
    if drop is None and stored is not None:
        known = stored.get(answer.name)
        if known is not None:
            probe = apply_event(known, answer, now_ns=run.clock.now_ns())
            if not probe.applied:
                drop = probe
    if drop is not None:  # a drop against it is a drop against any newer record
        run.settle(Ingested(drop), "discover")
        return answer.name, Discovered(drop.record, progress_of(answer))
    try:
        decision = run.ingest(answer, "discover", known)
    except Exception as exc:
        run.error("ingest failed", name=answer.name, error=f"{type(exc).__name__}: {exc}")
        return None, Discovered(None)
    record = decision.record if decision is not None else None
    return answer.name, Discovered(record, progress_of(answer))
