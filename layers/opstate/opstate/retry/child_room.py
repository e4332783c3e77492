"""A retry batch in the project's queue (issue 46; docs/jobs.md, "The shared count"): a child's
create takes its tokens of its model's cap and a batch slot in the counters a job's parts
take (``opstate.retry.room``), so that parts and retry batches together never pass
``OPSTATE_SUBMIT_MAX_BATCHES`` nor a model's enqueued tokens by opstate's count.

- Before its claim is written, a child reserves (``hold``): its tokens are
  ``domain.parts.range_tokens`` of its input's bytes and rows (at most the model's cap: a child
  over it alone waits for an empty queue), its model's cap the configured one or a lower one
  learned. No room: the entry is left as it was (planned, or backing off): nothing is refused
  at Gemini, no attempt spent, the root is due again after ``check_s``; an operator's pass tries
  again at once.
- The reservation is written into the entry (``reserved``: ``{"model", "tokens"}``) with the
  claim, before the upload and the create: a runner that dies after it leaves it recorded, and
  the next claim of the entry uses it again rather than taking a second (it searches for the
  batch first, as any claim after a crash does).
- A create Gemini refused (backing off, or the lineage stopped) frees it in the write that says
  so; a create that may have happened (no answer, a 5xx) keeps it. A created child keeps it
  until its batch reaches a terminal state (``ended``): written ``freed`` first, then given
  back, so a runner that lost the write frees nothing twice. Never on a cancel alone: a
  cancelled batch may keep its quota a while (python-genai #2495).
- A child created by 0.6.0, or by a plan that names no model, recorded no reservation: it is
  not counted and nothing is freed for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opstate.config import model_id
from opstate.domain.model import OpRecord
from opstate.domain.parts import range_tokens
from opstate.domain.states import State
from opstate.retry import lineage, room
from opstate.retry.passes import LostRace, Runner
from opstate.store.counters import CountingStore
from opstate.store.retry_state import RetryState

RESERVED = "reserved"


@dataclass(frozen=True, slots=True)
class Held:
    """A child's reservation: what its entry records, and whether this claim just took it."""

    doc: Mapping[str, Any]
    new: bool


# Not counted (a store without counters, a plan that names no model): nothing to record.
UNCOUNTED = Held({}, False)


def live(entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The reservation ``entry`` holds (recorded and not freed), if any."""
    return room.reservation(entry.get(RESERVED))


def hold(runner: Runner, entry: Mapping[str, Any]) -> Held | None:
    """The reservation the claim of ``entry`` creates under: the one an earlier claim recorded,
    else a new one; None when the queue has no room for it by opstate's count."""
    store = runner.store
    model = entry.get("model")
    if not isinstance(store, CountingStore) or not isinstance(model, str) or not model:
        return UNCOUNTED
    kept = live(entry)
    if kept is not None:
        return Held(kept, False)
    model = model_id(model)
    config = runner.config
    cap = room.cap_for(store, model, room.configured_cap(config.submit_caps, model))
    tokens = min(cap, range_tokens(_size(runner, entry), _count(entry.get("rows"))))
    if not room.reserve(store, model, tokens, cap, config.submit_max_batches):
        return None
    return Held({"model": model, "tokens": tokens}, True)


def claim(
    runner: Runner,
    at: tuple[OpRecord, RetryState],
    doc: dict[str, Any],
    entry: dict[str, Any],
    held: Held,
) -> RetryState:
    """Write ``doc`` (the root's, ``entry`` claimed in it) with the reservation the claim took
    recorded in the entry (given back when the write lost: another runner holds it)."""
    root, state = at
    if held.new:
        entry[RESERVED] = dict(held.doc)
    try:
        return runner.write(root, state, doc)
    except LostRace:
        give_back(runner, [held.doc] if held.new else [])
        raise


def _size(runner: Runner, entry: Mapping[str, Any]) -> int:
    size = entry.get("bytes")
    if isinstance(size, int) and size > 0:
        return size
    stored = runner.sink.head(runner.sink.resolve(str(entry.get("input"))))
    return stored.size if stored is not None else 0


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def give_back(runner: Runner, held: Iterable[Mapping[str, Any]]) -> None:
    """Free reservations whose freeing was written (or that were never written)."""
    store = runner.store
    if not isinstance(store, CountingStore):
        return
    for doc in held:
        room.free(store, str(doc["model"]), int(doc["tokens"]))


def drop(entry: dict[str, Any]) -> list[Mapping[str, Any]]:
    """Take ``entry``'s live reservation out of it (in a change about to be written): its
    create was refused or will never be; the caller frees what this returns once written."""
    found = live(entry)
    if found is None:
        return []
    entry.pop(RESERVED, None)
    return [found]


def free_ended(runner: Runner, root: OpRecord, state: RetryState) -> RetryState:
    """``ended`` for the created children that hold a reservation, read from the store: run
    before a claim, so that a child waiting for room is not kept waiting by a sibling that
    has ended (the pass notes the others once nothing is left to create)."""
    names = [
        str(c.get("name"))
        for c in lineage.children(state.doc)
        if c.get("phase") == lineage.CREATED and live(c) is not None
    ]
    records = {name: runner.store.get(name) for name in names}
    return ended(runner, root, state, records) if records else state


def ended(
    runner: Runner, root: OpRecord, state: RetryState, records: Mapping[str, OpRecord | None]
) -> RetryState:
    """A created child that ended gets its state in the plan (``state``: the record's,
    EXPIRED for an expired one), so the root's view shows it finished, and its reservation
    marked freed; written once, then its room given back."""
    doc = lineage.mutable(state.doc)
    changed = False
    freed: list[Mapping[str, Any]] = []
    for entry in lineage.children(doc):
        record = records.get(str(entry.get("name")))
        if entry.get("phase") != lineage.CREATED or record is None or not record.terminal:
            continue
        shown = "EXPIRED" if _expired(record) else str(record.state)
        if entry.get("state") != shown:
            entry["state"] = shown
            changed = True
        held = live(entry)
        if held is not None:
            freed.append(dict(held))
            entry[RESERVED] = {**held, "freed": True}
            changed = True
    if not changed:
        return state
    written = runner.write(root, state, doc)
    give_back(runner, freed)
    return written


def _expired(record: OpRecord) -> bool:
    return record.state is State.FAILED and record.details.get("reason") == "expired"
