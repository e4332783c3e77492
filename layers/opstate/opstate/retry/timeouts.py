"""Step 3 of a retry pass (``opstate.retry.engine``; docs/retry.md, "pendingTimeoutHours"): a
member of the lineage still PENDING past the policy's timeout (in the store's view) is read
itself and cancelled only when Gemini says it is PENDING, opstate created it
(``acting.ours``) and Gemini's ``createTime`` is that long ago, never less than an hour
(``acting.pending_limit_ns``). A batch that is not opstate's is never cancelled and not read
again for it (``notOurs``), nor one Gemini knows not (``unknown``). When a member is due after
the lineage cancelled ``MAX_CANCELS_PER_LINEAGE`` batches, nothing is cancelled and the lineage
stops (it creates nothing more), said once."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.gemini.errors import GatewayError
from opstate.ingest import ingest
from opstate.observability import count, log_fields, logger
from opstate.retry import acting, lineage
from opstate.retry.authority import acting_policy
from opstate.retry.passes import Runner
from opstate.store.retry_state import RetryState


def pending_timeouts(
    runner: Runner,
    cancel: Callable[[str], bool],
    root: OpRecord,
    state: RetryState,
    refs: list[lineage.MemberRef],
    records: Mapping[str, OpRecord | None],
) -> RetryState:
    hours = acting_policy(state.doc).pending_timeout_hours
    if hours is None or state.doc.get("stopped"):
        return state
    now = runner.clock_ns()
    limit = acting.pending_limit_ns(hours)
    skip = {
        *lineage.cancelled(state.doc),
        *lineage.unknown(state.doc),
        *lineage.names_of(state.doc, "notOurs"),
    }
    for ref in refs:
        record = records.get(ref.name)
        if record is None or record.state is not State.PENDING or ref.name in skip:
            continue
        since = record.created_ns or record.update_time_ns
        if not since or now - since < limit:
            continue  # not even in the store's view: no read
        if len(lineage.cancelled(state.doc)) >= acting.MAX_CANCELS_PER_LINEAGE:
            return _stop_cancelling(runner, root, state)
        state = _timeout(runner, cancel, root, state, ref, now, limit)
    return state


def _timeout(
    runner: Runner,
    cancel: Callable[[str], bool],
    root: OpRecord,
    state: RetryState,
    ref: lineage.MemberRef,
    now: int,
    limit: int,
) -> RetryState:
    """Member ``ref`` looks pending past its timeout: read it; cancel it only when Gemini
    says PENDING, opstate created it and Gemini's ``createTime`` is ``limit`` ago."""
    try:
        job = acting.read_job(runner.client, ref.name)
    except GatewayError as exc:
        log_fields(logger.warning, "pending job not read", {"name": ref.name, "error": exc.message})
        return state
    if job.event is None:  # never cancelled; not read again for its timeout
        log_fields(logger.warning, "pending job unknown to Gemini", {"name": ref.name})
        doc = lineage.mutable(state.doc)
        doc["unknown"] = [*lineage.unknown(doc), ref.name]
        return runner.write(root, state, doc)
    if job.state is not State.PENDING:
        ingest(runner.store, job.event)
        return state
    if not acting.ours(state.doc, ref, job, runner.sink):
        log_fields(
            logger.warning,
            "pending timeout: not cancelled, opstate did not create this batch",
            {"name": ref.name, "root": root.name},
        )
        doc = lineage.mutable(state.doc)
        doc["notOurs"] = [*lineage.names_of(doc, "notOurs"), ref.name]
        return runner.write(root, state, doc)
    if not acting.old_enough(job, now, limit):
        return state
    if not cancel(ref.name):
        return state
    doc = lineage.mutable(state.doc)
    doc["cancelled"] = [*lineage.cancelled(doc), ref.name]
    runner.result.cancelled += 1
    return runner.write(root, state, doc)


def _stop_cancelling(runner: Runner, root: OpRecord, state: RetryState) -> RetryState:
    """A member is due for a cancel after the lineage sent ``MAX_CANCELS_PER_LINEAGE``:
    nothing is cancelled, the lineage stops (it creates nothing more) and says so once."""
    most = acting.MAX_CANCELS_PER_LINEAGE
    why = (
        f"this lineage cancelled {most} batches for their pending timeout, the most one "
        "lineage may: it cancels and creates nothing more"
    )
    doc = lineage.mutable(state.doc)
    doc["stopped"] = why
    for entry in lineage.unfinished(doc):
        if entry.get("phase") == lineage.PLANNED:
            entry.update(phase=lineage.REFUSED, error="the lineage stopped", claimUntilNs=0)
    state = runner.write(root, state, doc)
    runner.result.stopped += 1
    count("RetryStopped")
    log_fields(logger.error, "retry lineage stopped", {"name": root.name, "why": why})
    return state
