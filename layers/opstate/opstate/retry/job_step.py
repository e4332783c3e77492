"""A job in the retry pass (issue 46; docs/jobs.md): one record ``jobs/<id>`` whose retry state
holds its parts plan (``doc["job"]``: ``opstate.retry.jobs``). The engine hands it here
(``job_step``) instead of a lineage's step: one engine moves a job's parts and their retries.

A step: the feeding step (``opstate.retry.feeding``) over the plan; each part it created is
tracked (ingested) and becomes attempt 0 of its own lineage under the job's policy, with its
own kept copy of its lines (the lineage's retries are cut from it); once no part will be
created or is open and every part's lineage wrote its final result, the job's ``final.jsonl``
is written: each part's final result in input order, and for a part never submitted (the job
stopped) one error line per key, never an answer. The job's record then ends SUCCEEDED (or
CANCELLED when it was stopped).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from opstate.domain.costs import job_cost
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.retry import policy_of
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.observability import count, log_fields, logger
from opstate.outcomes.plan import prefix_of
from opstate.retry import job_rate, jobs, room
from opstate.retry.authority import VIA_SUBMIT
from opstate.retry.feeding import Feeder, FeedLimits, LostPlan, byte_range
from opstate.retry.finalize import FINAL_KEY, FINAL_LEDGER_KEY, lines_of
from opstate.retry.inputs import keep_input
from opstate.retry.passes import LostRace, Runner
from opstate.retry.policy import attach_policy
from opstate.retry.reading import key_of
from opstate.store.counters import CountingStore
from opstate.store.port import RetryingStore
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RetryState

JOB = "job"
JOB_SOURCE = "report"  # the job's record is opstate's own report of it
NOT_SUBMITTED = "NOT_SUBMITTED"
PART_OF = "partOf"  # in a part's retry state: the job it belongs to


def plan_of(state: RetryState) -> Mapping[str, Any] | None:
    plan = state.doc.get(JOB)
    return plan if isinstance(plan, Mapping) else None


class StatePlan:
    """The plan kept in a job record's retry state, written under the state's revision."""

    def __init__(self, store: RetryingStore, name: str, created_ns: int) -> None:
        self.store = store
        self.name = name
        self.created_ns = created_ns
        self.states: dict[int, RetryState] = {}

    def read(self) -> tuple[int, Mapping[str, Any]]:
        state = self.store.get_retry(self.name)
        plan = plan_of(state) if state is not None else None
        if state is None or state.created_ns != self.created_ns or plan is None:
            raise LostPlan(f"{self.name} holds no job plan")
        self.states = {state.rev: state}
        return state.rev, plan

    def write(self, rev: int, plan: Mapping[str, Any]) -> bool:
        state = self.states.get(rev)
        if state is None:
            return False
        written = replace(state, doc={**state.doc, JOB: dict(plan)})
        return bool(self.store.set_retry(self.name, rev, written))


def limits_of(plan: Mapping[str, Any]) -> FeedLimits:
    raw = plan.get("limits")
    given = raw if isinstance(raw, Mapping) else {}
    return FeedLimits(
        cap=int(given["cap"]),
        max_batches=int(given["maxBatches"]),
        max_file_bytes=int(given["maxFileBytes"]),
        max_rows=int(given["maxRows"]),
    )


def job_step(runner: Runner, root: OpRecord, state: RetryState) -> bool:
    """The step of ``root`` when it is a job (False: it is no job, a lineage's step follows)."""
    plan = plan_of(state)
    if plan is None:
        return False
    store = runner.store
    if not isinstance(store, CountingStore):
        raise LostRace(f"{root.name}: this store keeps no counters")
    holder = StatePlan(store, root.name, root.created_ns)
    source = plan["input"]["location"]
    feeder = Feeder(
        holder,
        store,
        runner.client,
        lambda: iter(runner.sink.chunks(source)),
        lambda batch: _is_open(store, batch),
        limits_of(plan),
        clock_ns=runner.clock_ns,
    )
    taught = job_rate.lesson(plan, store.get_archive)  # the parts' usageMetadata
    if taught is not None:
        feeder.change(taught)
    shared = room.learned(store, plan["model"])  # a cap another job of the model learned
    if shared is not None and shared < jobs.cap_of(plan, feeder.limits.cap):
        feeder.change(partial(jobs.learn, cap=shared))
    said = state.doc.get("stopped")
    if said and not plan.get("stopped"):  # ``opstate retry --stop JOB`` (``stop_lineage``)
        feeder.change(partial(jobs.stop, why=str(said)))
    fed = feeder.step(every=runner.every)
    _, plan = holder.read()
    for event in fed.created:
        _track(runner, root, plan, event)
    runner.result.submitted += len(fed.created)
    fresh = runner.store.get_retry(root.name)
    if fresh is None:
        return True
    plan = plan_of(fresh) or plan
    if jobs.finished(plan) and all(_final_of(store, p) for p in plan["parts"] if p.get("batch")):
        _write_final(runner, root, fresh, plan)
        return True
    view = jobs.summary(plan)
    count("JobPartsHeld", view["parts"][jobs.HELD])
    count("JobTokensEnqueued", view["enqueuedTokens"])
    due = runner.clock_ns() + int(runner.config.check_s * 1e9)
    if fresh.due_ns <= runner.clock_ns() or due < fresh.due_ns:
        runner.write(root, fresh, fresh.doc, due_ns=due)
    runner.result.waiting += 1
    return True


def _is_open(store: RetryingStore, batch: str) -> bool:
    record = store.get(batch)
    return record is None or not record.terminal


def _track(runner: Runner, root: OpRecord, plan: Mapping[str, Any], event: OpEvent) -> None:
    """A created part: tracked, and attempt 0 of its own lineage under the job's policy, with
    its lines kept as its own input (a lineage's retries are cut from its kept input)."""
    store, sink = runner.store, runner.sink
    part = next(p for p in plan["parts"] if p.get("batch") == event.name)
    decision = ingest(store, event)
    record = decision.record or store.get(event.name)
    if record is None:
        return  # tracked by the next step's recovery
    location = plan["input"]["location"]
    kept = keep_input(
        lambda: byte_range(sink.chunks(location), part["start"], part["end"]),
        sink,
        runner.config.max_line_bytes,
        name=event.name,
    )
    now = runner.clock_ns()
    written = attach_policy(
        store,
        record,
        policy_of(plan),
        model=plan["model"],
        now_ns=now,
        via=VIA_SUBMIT,
        kept_input=kept.as_dict(),
    )
    if written is not None:
        # The part names its job (``wiring.roots_of``: a part's terminal change steps the job
        # too); a job without retries still has each part's final written by its lineage.
        store.set_retry(
            record.name,
            written.rev,
            replace(
                written, status=RETRY_ACTIVE, due_ns=now, doc={**written.doc, PART_OF: root.name}
            ),
        )
    log_fields(logger.info, "job part tracked", {"job": root.name, "name": record.name})


def _final_of(store: RetryingStore, part: Mapping[str, Any]) -> str | None:
    """The location of a created part's final result, once its lineage wrote it."""
    state = store.get_retry(part["batch"])
    final = state.doc.get("final") if state is not None else None
    if isinstance(final, Mapping) and final.get("status") == "final":
        location = final.get("location")
        return location if isinstance(location, str) else None
    return None


def _write_final(
    runner: Runner, root: OpRecord, state: RetryState, plan: Mapping[str, Any]
) -> None:
    store, sink = runner.store, runner.sink
    why = str(plan.get("stoppedWhy") or "the job stopped")
    digest = hashlib.sha256()
    rows = {"total": 0, "answered": 0, "blocked": 0, "failed": 0}
    errors: Counter[str] = Counter()
    attempts = 0
    costs: list[tuple[str, Mapping[str, Any] | None]] = []
    with sink.open(f"{prefix_of(root)}/{FINAL_KEY}", name=root.name) as out:
        for part in sorted(plan["parts"], key=lambda p: int(p["start"])):
            chunks: Iterator[bytes]
            if part.get("batch"):
                location = _final_of(store, part)
                assert location is not None
                chunks = iter(sink.chunks(location))
                attempts += _add_counts(store, part["batch"], rows, errors)
                costs.append((part["batch"], _cost_of(store, part["batch"])))
            else:
                chunks = _not_submitted(runner, plan, part, why)
                for key in ("total", "failed"):
                    rows[key] += int(part["rows"])
                errors[NOT_SUBMITTED] += int(part["rows"])
            for chunk in chunks:
                out.write(chunk)
                digest.update(chunk)
        stored = out.commit(digest.hexdigest())
    cost = job_cost(costs)
    ledger = json.dumps(
        {
            "name": root.name,
            "parts": [p.get("batch") for p in plan["parts"]],
            "rows": rows,
            "errors": dict(errors),
            "attempts": attempts,
            "cost": cost,
            "location": stored.location,
            "stopped": plan.get("stoppedWhy"),
        },
        sort_keys=True,
        indent=1,
    ).encode()
    with sink.open(f"{prefix_of(root)}/{FINAL_LEDGER_KEY}", name=root.name) as out:
        out.write(ledger)
        out.commit(hashlib.sha256(ledger).hexdigest())
    doc = dict(state.doc)
    doc["final"] = {
        "status": "final",
        "location": stored.location,
        "rows": rows,
        "errors": dict(errors),
        "attempts": attempts,
        "cost": cost,
    }
    runner.write(root, state, doc, status=RETRY_DONE, due_ns=0)
    ended = State.CANCELLED if plan.get("stopped") else State.SUCCEEDED
    ingest(store, OpEvent(root.name, ended, runner.clock_ns(), JOB_SOURCE, {"kind": "job"}))
    runner.result.final += 1
    count("JobFinal")
    log_fields(logger.info, "job final", {"name": root.name, **rows})
    if runner.on_final is not None:
        runner.on_final(root.name)


def _cost_of(store: RetryingStore, batch: str) -> Mapping[str, Any] | None:
    """A created part's lineage cost, as its final stored it (None: unknown)."""
    state = store.get_retry(batch)
    final = state.doc.get("final") if state is not None else None
    cost = final.get("cost") if isinstance(final, Mapping) else None
    return cost if isinstance(cost, Mapping) else None


def _add_counts(
    store: RetryingStore, batch: str, rows: dict[str, int], errors: Counter[str]
) -> int:
    """Add a part's final counts (its lineage's ledger) to the job's; its attempts."""
    state = store.get_retry(batch)
    final = state.doc.get("final") if state is not None else None
    final = final if isinstance(final, Mapping) else {}
    counted = final.get("rows")
    for key in rows:
        value = counted.get(key) if isinstance(counted, Mapping) else None
        rows[key] += value if isinstance(value, int) else 0
    said = final.get("errors")
    for code, n in said.items() if isinstance(said, Mapping) else ():
        if isinstance(n, int):
            errors[str(code)] += n
    attempts = final.get("attempts")
    return attempts if isinstance(attempts, int) else 0


def _not_submitted(
    runner: Runner, plan: Mapping[str, Any], part: Mapping[str, Any], why: str
) -> Iterator[bytes]:
    """One error line per key of a part never submitted: never an answer."""
    location = plan["input"]["location"]
    chunks = byte_range(runner.sink.chunks(location), part["start"], part["end"])
    message = f"not submitted: {why}"
    for line in lines_of(chunks, runner.config.max_line_bytes):
        key = key_of(line)
        if key is not None:
            row = {"key": key, "error": {"code": NOT_SUBMITTED, "message": message}}
            yield json.dumps(row, ensure_ascii=False).encode() + b"\n"
