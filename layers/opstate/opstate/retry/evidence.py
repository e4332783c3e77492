"""Gemini's word before planning (step 5 of a retry pass, ``opstate.retry.engine``; docs/retry.md,
"What opstate acts on"): a member is resubmitted whole, or has rows retried, only when Gemini,
read right then, says so (``acting.whole_evidence``; SUCCEEDED for row retries), on the model
Gemini names; what Gemini said otherwise is ingested and nothing is planned from it. A member
Gemini answers 404 for (``Unknown``) makes the lineage's retry ``unavailable``: nothing more
is planned and the final result follows with what is known."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.domain.model import OpRecord
from opstate.domain.retry import RetryPolicy
from opstate.gemini.errors import GatewayError
from opstate.ingest import ingest
from opstate.observability import count, log_fields, logger
from opstate.retry import acting, lineage
from opstate.retry.cutting import whole_inputs
from opstate.retry.passes import Runner
from opstate.store.port import RetryableError
from opstate.store.retry_state import RetryState


class Unknown(Exception):
    """Gemini answered 404 for a member read before acting on it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def whole_input(
    runner: Runner,
    root: OpRecord,
    doc: Mapping[str, Any],
    ref: lineage.MemberRef,
    cancelled_by_us: bool,
    policy: RetryPolicy,
    attempt: int,
    room: int,
    start: int,
) -> list[lineage.ChildInput]:
    """Member ``ref``'s whole input as children of attempt ``attempt``, when Gemini, read now,
    says it ended so (not the record: a report may have said it), on the model Gemini says it
    ran on: its input itself, or split by ``max_rows`` (``cutting.whole_inputs``: at most
    ``room`` children in the attempt, ``start`` planned already)."""
    assert ref.input is not None and ref.rows is not None
    job = read(runner, ref.name)
    if not acting.whole_evidence(job, ref.attempt, cancelled_by_us, policy.resubmit_expired):
        not_said(runner, root, job)
        return []
    return whole_inputs(runner, root, doc, ref, attempt, room, start, job.model)


def read(runner: Runner, name: str) -> acting.Job:
    """Batch ``name`` as Gemini says now (``Unknown`` for a 404; a failed read ends the
    root's step: it is due again)."""
    try:
        job = acting.read_job(runner.client, name)
    except GatewayError as exc:
        raise RetryableError(f"{name} could not be read: {exc.message}") from exc
    if job.event is None:
        raise Unknown(name)
    return job


def not_said(runner: Runner, root: OpRecord, job: acting.Job) -> None:
    """Gemini's word on ``job`` does not allow what the record suggested: nothing is
    planned from it; what Gemini said is ingested (the record follows it when it may)."""
    assert job.event is not None
    log_fields(
        logger.warning,
        "retry not planned: Gemini does not say so",
        {"name": job.name, "root": root.name, "gemini": str(job.state)},
    )
    ingest(runner.store, job.event)


def mark_unknown(runner: Runner, root: OpRecord, state: RetryState, name: str) -> RetryState:
    """Gemini answered 404 for member ``name``: retry is ``unavailable`` (never "expired"),
    nothing more is planned; the final result is written with what is known."""
    why = acting.gone_reason(name)
    doc = lineage.mutable(state.doc)
    doc["unavailable"] = why
    doc["unknown"] = [*lineage.unknown(doc), name]
    runner.result.unavailable += 1
    count("RetryUnavailable")
    log_fields(logger.warning, "retry unavailable", {"name": root.name, "why": why})
    return runner.write(root, state, doc)
