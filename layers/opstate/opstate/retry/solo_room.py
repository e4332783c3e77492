"""A batch submitted alone in the project's queue (issue 46; docs/jobs.md, "A batch submitted
alone"): ``opstate submit`` (and the submit function) of an input that fits one part takes its
tokens of its model's cap and a batch slot in the counters a job's parts and retry batches take
(``opstate.retry.room``), so that it never pushes Gemini's queue past opstate's count.

- Before its upload, the reservation is taken (``take``) and written in the submit's marker
  (``retry.submit``): a call that dies before the create, or without an answer to it, leaves it
  recorded, and the next call of the same submit uses it instead of taking another. A create
  Gemini answered with a refusal frees it (the marker written without it first).
- No room by opstate's count, or a create Gemini refuses for a full queue (429, not money): the
  input becomes a job of one part (``retry.job_submit``), held and fed by the pass as room frees.
- Created: the reservation is written in the batch's retry state (``reserved``:
  ``{"model", "tokens"}``), which stays ``active`` (even when no retry policy asks for
  anything: then the pass does nothing else for it) until the pass, seeing the batch
  terminal, writes it ``freed`` and gives it back (``settle``); never on a cancel alone
  (python-genai #2495).
- Batches submitted by 0.6.0 or before this release recorded nothing: they free nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.config import SubmitSettings, model_id
from opstate.domain.model import OpRecord
from opstate.domain.refusals import Refusal
from opstate.domain.retry import enabled, policy_of
from opstate.gemini.errors import GatewayError
from opstate.gemini.submit import create_refusal
from opstate.retry import room
from opstate.retry.passes import Runner
from opstate.store.counters import CountingStore
from opstate.store.port import RetryingStore
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RetryState

RESERVED = "reserved"
NS_PER_SECOND = 1_000_000_000
WRITE_TRIES = 4


class NoRoom(Exception):
    """The model's queue has no room for the batch by opstate's count: nothing was sent."""


def take(
    store: RetryingStore, limits: SubmitSettings, model: str, tokens: int
) -> Mapping[str, Any] | None:
    """The reservation of a batch of ``tokens`` (at most the model's cap: one over it alone
    waits for an empty queue); ``{}`` for a store that keeps no counters (not counted); None
    when there is no room."""
    if not isinstance(store, CountingStore):
        return {}
    model, cap, tokens = _sized(store, limits, model, tokens)
    if not room.reserve(store, model, tokens, cap, limits.submit_max_batches):
        return None
    return {"model": model, "tokens": tokens}


def fits(store: RetryingStore, limits: SubmitSettings, model: str, tokens: int) -> bool:
    """Whether a batch of ``tokens`` has room now by opstate's count (read only: ``take``
    reserves, just before the upload)."""
    if not isinstance(store, CountingStore):
        return True
    model, cap, tokens = _sized(store, limits, model, tokens)
    if room.open_slots(store) + 1 > limits.submit_max_batches:
        return False
    return room.enqueued(store, model) + tokens <= cap


def _sized(
    store: CountingStore, limits: SubmitSettings, model: str, tokens: int
) -> tuple[str, int, int]:
    """The model's id, the cap it is fed under and the batch's tokens, at most that cap."""
    model = model_id(model)
    cap = room.cap_for(store, model, limits.enqueued_cap(model))
    return model, cap, max(1, min(tokens, cap))


def give_back(store: RetryingStore, held: Mapping[str, Any] | None) -> None:
    """Free ``held`` (once: its freeing is written first, or it was never written)."""
    found = room.reservation(held)
    if found is not None and isinstance(store, CountingStore):
        room.free(store, str(found["model"]), int(found["tokens"]))


def queue_full(exc: BaseException) -> bool:
    """A create Gemini refused for a full queue or a rate limit (429, not money)."""
    if not isinstance(exc, GatewayError) or exc.status != 429:
        return False
    return create_refusal(exc).kind is not Refusal.MONEY


def record(store: RetryingStore, name: str, created_ns: int, held: Mapping[str, Any]) -> None:
    """Write ``held`` into the retry state of the batch ``name`` (kept just before by
    ``attach_policy``); a state that is ``done`` (no policy) is made active."""
    found = room.reservation(held)
    if found is None:
        return
    for _ in range(WRITE_TRIES):
        state = store.get_retry(name)
        if state is None or state.created_ns != created_ns:
            return
        if room.reservation(state.doc.get(RESERVED)) is not None or state.doc.get(RESERVED):
            return  # recorded already (a call found again)
        doc = {**state.doc, RESERVED: dict(found)}
        due = state.due_ns if state.status == RETRY_ACTIVE else 0
        written = RetryState(RETRY_ACTIVE, created_ns=created_ns, due_ns=due, doc=doc)
        if store.set_retry(name, state.rev, written):
            return


def settle(runner: Runner, root: OpRecord, state: RetryState) -> RetryState | None:
    """A root holding a batch's reservation: once the batch is terminal, the reservation is
    written ``freed`` (and the state ``done`` when no policy asks for retries), then given
    back. None when the pass has nothing more to do for the root (no policy)."""
    held = room.reservation(state.doc.get(RESERVED))
    if held is None:
        return state
    only = not enabled(policy_of(state.doc))
    if not root.terminal:
        if not only:
            return state
        due = runner.clock_ns() + int(runner.config.check_s * NS_PER_SECOND)
        if state.due_ns <= runner.clock_ns():
            runner.write(root, state, state.doc, due_ns=due)
        return None
    doc = {**state.doc, RESERVED: {**held, "freed": True}}
    if only:
        runner.write(root, state, doc, status=RETRY_DONE, due_ns=0)
        give_back(runner.store, held)
        return None
    written = runner.write(root, state, doc)
    give_back(runner.store, held)
    return written
