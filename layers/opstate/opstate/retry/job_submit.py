"""Submitting an input larger than one batch as a job (issue 46; docs/jobs.md).

The input is kept first (checked line by line, copied into the sink: ``retry.inputs``; never
read back), then read again through the sha256 the check found and cut into parts under the
model's cap, the file bytes and the rows (``domain.parts``; a line over a bound is an error
naming it, nothing created). An input of one part is no job: the caller submits it as a batch,
as before (``alone``: its room taken in the project's queue, ``solo_room``), unless that
queue has no room for it: then it is a job of one part, held. Otherwise the job's record
``jobs/<id>`` is written (PENDING) with its plan in its retry state, active and due now,
and (``opstate submit``) the first feeding step runs at once: what fits is created before
the command returns, the rest is held for the retry pass. The submit function leaves the
feeding to the archiver's pass (its role reads no kept input).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opstate.config import SubmitSettings, model_id
from opstate.domain.model import OpEvent
from opstate.domain.parts import Bounds, split_hashed
from opstate.domain.retry import RetryPolicy
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.outcomes.sink import Sink
from opstate.retry import jobs, room
from opstate.retry.feeding import lines_of
from opstate.retry.inputs import KeptInput, keep_input, verified
from opstate.retry.job_step import JOB, JOB_SOURCE
from opstate.store.counters import CountingStore
from opstate.store.port import RetryingStore
from opstate.store.retry_state import RETRY_ACTIVE, RetryState

JOBS = "jobs/"


def job_id_of(sha256: str, model: str, display_name: str) -> str:
    """A job's id: of its input, model and display name, so that submitting the same again
    (a re-run after a crash) finds the job instead of making a second. Not secret: what must
    stay unguessable is each part's nonce, never published."""
    text = f"{sha256}\0{model}\0{display_name}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    name: str
    parts: int
    input: KeptInput
    created: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": str(State.PENDING),
            "created": self.created,
            "parts": self.parts,
            "input": {
                "location": self.input.location,
                "sha256": self.input.sha256,
                "rows": self.input.rows,
                "bytes": self.input.bytes,
            },
        }


def submit_job(
    store: RetryingStore,
    sink: Sink,
    source: Callable[[], Any],
    *,
    model: str,
    policy: RetryPolicy,
    limits: SubmitSettings,
    display_name: str = "",
    max_line_bytes: int = 32 * 1024 * 1024,
    clock_ns: Callable[[], int] = time.time_ns,
    alone: Callable[[int], bool] | None = None,
) -> JobSubmitted | None:
    """Keep ``source`` (a chunk-stream callable), plan its parts and write the job (module
    docstring); None when it fits one part (and ``alone``, told its tokens, says it may go
    alone: False makes it a job of one part; None: always alone); the job found (``created``
    False) when the same input, model and display name were submitted before. ``InputError`` /
    ``SplitError`` / ``jobs.PlanError`` for an input that cannot be a job (nothing created)."""
    if not model.strip():
        raise ValueError("a model is required (--model)")
    # Nothing kept is read back (as ``retry.submit``): the submit function's role reads its
    # input under incoming/, never a kept input. The split reads the input a third time,
    # through the sha256 the check found (a source changed since is refused: nothing made).
    kept = keep_input(source, sink, max_line_bytes, reuse=False)
    model = model_id(model)
    cap = limits.enqueued_cap(model)
    # A cap a refusal taught an earlier job of the model (``opstate.retry.room``) is where
    # this one starts; a configured cap below it wins.
    taught = room.learned(store, model) if isinstance(store, CountingStore) else None
    split_cap = min(cap, taught) if taught is not None else cap
    bounds = Bounds(split_cap, limits.submit_max_file_bytes, limits.submit_max_rows)
    read = verified(source(), kept.sha256, "the input")
    parts = list(split_hashed(lines_of(read), bounds))
    job_id = job_id_of(kept.sha256, model, display_name)
    name = f"{JOBS}{job_id}"
    found = store.get_retry(name)
    if found is not None and found.doc.get(JOB) is not None:
        # Submitted before (a re-run after a crash, or twice): the same job, never a second.
        return JobSubmitted(name, len(found.doc[JOB]["parts"]), kept, created=False)
    if len(parts) <= 1 and (alone is None or not parts or alone(parts[0].tokens)):
        return None
    plan = jobs.new_plan(job_id, model, kept.as_dict(), parts)
    plan["policy"] = policy.as_doc()
    if split_cap < cap:
        jobs.learn(plan, split_cap)
    plan["limits"] = {
        "cap": cap,
        "maxBatches": limits.submit_max_batches,
        "maxFileBytes": limits.submit_max_file_bytes,
        "maxRows": limits.submit_max_rows,
    }
    now = clock_ns()
    details = {"kind": "job", "model": model, "rows": kept.rows, "parts": len(parts)}
    decision = ingest(store, OpEvent(name, State.PENDING, now, JOB_SOURCE, details))
    record = decision.record or store.get(name)
    assert record is not None
    state = RetryState(RETRY_ACTIVE, created_ns=record.created_ns, due_ns=now, doc={JOB: plan})
    if not store.set_retry(name, 0, state):  # another call of the same submit was first
        return JobSubmitted(name, len(parts), kept, created=False)
    return JobSubmitted(name, len(parts), kept)
