"""A retry policy kept beside a record (issue 33; docs/retry.md): ``attach_policy`` writes a
root's retry state from a policy (``PUT /operations`` with ``"retry"``, ``opstate track``'s
flags, ``opstate submit``), ``settings_policy`` is the deployment's default policy.

Only an explicit request attaches a policy: a record created by a webhook, a poll or a report
without ``"retry"`` gets none, whatever the default says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from opstate.config import RetrySettings
from opstate.domain.model import OpRecord
from opstate.domain.retry import InvalidRetryError, RetryPolicy, enabled, retry_view
from opstate.retry import lineage
from opstate.retry.authority import VIAS
from opstate.store.port import RetryingStore, Store, StoreUnavailableError
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RETRY_MEMBER, RetryState

# Conditional writes tried before a lost race is reported as the store being busy.
ATTACH_ATTEMPTS = 5
# The keys of a root's ``input`` map (design: source, kept copy, its digest and size).
INPUT_KEYS = ("source", "location", "sha256", "rows", "bytes")
# A root's final result before the runner has written one.
PENDING_FINAL: Mapping[str, Any] = {
    "status": "pending",
    "location": None,
    "rows": None,
    "errors": None,
    "retried": 0,
    "attempts": 0,
}


def is_child(store: RetryingStore, name: str) -> bool:
    """Whether ``name`` is a retry child (it takes its root's policy; none of its own)."""
    state = store.get_retry(name)
    return state is not None and state.status == RETRY_MEMBER


def check_keepable(store: Store, name: str) -> RetryingStore:
    """``store``, when a policy may be kept beside ``name`` in it (``PUT /operations`` with
    ``"retry"``, ``opstate track``'s flags), checked before anything is written;
    ``InvalidRetryError`` when the store keeps no retry policies or ``name`` is a retry child
    (it takes its root's policy). A store fault passes through."""
    if not isinstance(store, RetryingStore):
        raise InvalidRetryError("this store keeps no retry policies")
    if is_child(store, name):
        raise InvalidRetryError(f"{name} is a retry child: it takes its root's policy")
    return store


def keep_policy(
    store: RetryingStore, record: OpRecord, policy: RetryPolicy, now_ns: int, *, via: str
) -> dict[str, Any] | None:
    """``attach_policy`` for the record a report left, and the ``retry`` view of what was
    written (None: nothing was). ``ValueError`` when the record became a retry child since
    ``check_keepable``. No model is kept from the report's details (issue 38): the retry
    runner reads the model off Gemini's own resource of the batch it resubmits."""
    state = attach_policy(store, record, policy, model=None, now_ns=now_ns, via=via)
    return None if state is None else retry_view(state.doc)


def settings_policy(settings: RetrySettings) -> RetryPolicy:
    """The deployment's default policy (``OPSTATE_RETRY_MAX_ATTEMPTS``,
    ``OPSTATE_RETRY_RESUBMIT_EXPIRED``, ``OPSTATE_RETRY_MAX_COST_USD``): what a ``"retry"``
    object's missing keys take."""
    return RetryPolicy(
        max_attempts=settings.retry_max_attempts,
        resubmit_expired=settings.retry_resubmit_expired,
        max_cost_usd=settings.retry_max_cost_usd,
    )


def attach_policy(
    store: RetryingStore,
    record: OpRecord,
    policy: RetryPolicy,
    *,
    model: str | None,
    now_ns: int,
    via: str,
    kept_input: Mapping[str, Any] | None = None,
    submit_id: str | None = None,
) -> RetryState | None:
    """Keep ``policy`` as the retry state of the root ``record`` and return the state written,
    with how it came (``via``: ``opstate.retry.authority.VIAS``; the last attach's).

    Enabled: the state is ``active``, due at ``now_ns``; an existing state of the same record
    incarnation keeps its children, final result and input (``input.source`` becomes
    ``policy.input`` when one is given; ``kept_input`` adds the kept copy's ``location``,
    ``sha256``, ``rows``, ``bytes``). Not enabled: an existing state is kept with the policy
    off (``done``), and so is a new one that names a kept input (``opstate submit`` without a
    policy: a later ``opstate track --retry-attempts`` uses it); otherwise nothing is written
    (None). A record that is a retry child is
    refused (``ValueError``): it takes its root's policy. The write is conditional on the
    state's ``rev``; a lost race is re-read and retried, ``ATTACH_ATTEMPTS`` times at most
    (then ``StoreUnavailableError``, a retryable store fault). ``submit_id``: the id
    ``opstate submit`` put in the batch's display name (``submitId``: opstate created it, so
    its pending timeout may cancel it)."""
    if via not in VIAS:
        raise ValueError(f"unknown provenance {via!r}")
    created_ns = record.created_ns
    for _ in range(ATTACH_ATTEMPTS):
        current = store.get_retry(record.name)
        same = current is not None and current.created_ns == created_ns
        if current is not None and same and current.status == RETRY_MEMBER:
            raise ValueError("a retry child takes its root's policy")
        if not enabled(policy) and not same and kept_input is None:
            return None
        state = _root_state(
            current.doc if current is not None and same else {},
            policy,
            model=model,
            created_ns=created_ns,
            now_ns=now_ns,
            kept_input=kept_input,
            via=via,
        )
        if submit_id is not None:
            state = replace(state, doc={**state.doc, "submitId": submit_id})
        expected = current.rev if current is not None else 0
        if store.set_retry(record.name, expected, state):
            return replace(state, rev=expected + 1)
        fresh = store.get(record.name)
        if fresh is None:
            raise StoreUnavailableError(f"{record.name} is no longer tracked")
        created_ns = fresh.created_ns
    raise StoreUnavailableError(
        f"the retry state of {record.name} changed under {ATTACH_ATTEMPTS} writes in a row"
    )


def _root_state(
    old: Mapping[str, Any],
    policy: RetryPolicy,
    *,
    model: str | None,
    created_ns: int,
    now_ns: int,
    kept_input: Mapping[str, Any] | None,
    via: str,
) -> RetryState:
    doc: dict[str, Any] = dict(old)
    doc.pop("lineage", None)
    doc["policy"] = policy.as_doc()
    doc["via"] = via
    if model is not None or "model" not in doc:
        doc["model"] = model
    old_input = old.get("input")
    held = dict(old_input) if isinstance(old_input, Mapping) else {}
    source = policy.input if policy.input is not None else held.get("source")
    if source != held.get("source"):  # another input named: its copy is the runner's to make
        held = {}
    doc["input"] = {key: held.get(key) for key in INPUT_KEYS} | {"source": source}
    if kept_input is not None:
        doc["input"] |= {key: kept_input[key] for key in INPUT_KEYS[1:] if key in kept_input}
    # Whether retry can run is the runner's to judge again with the new policy and input.
    doc["unavailable"] = None
    doc.setdefault("stopped", None)
    doc.setdefault("children", [])
    doc.setdefault("cancelled", [])
    doc.setdefault("final", dict(PENDING_FINAL))
    # A batch submitted alone holding its room in the queue stays active until the pass frees
    # it (``retry.solo_room``), whatever the policy.
    reserved = doc.get("reserved")
    on = enabled(policy) or (isinstance(reserved, Mapping) and not reserved.get("freed"))
    return RetryState(
        status=RETRY_ACTIVE if on else RETRY_DONE,
        created_ns=created_ns,
        rev=0,
        due_ns=now_ns if on else 0,
        doc=doc,
    )


STOPPED_BY_OPERATOR = "stopped by the operator (opstate retry --stop)"


class StopRefusedError(ValueError):
    """``stop_lineage`` was asked for a record that has no lineage to stop."""


def stop_lineage(store: RetryingStore, name: str, now_ns: int) -> str:
    """Stop the lineage of the root ``name`` (``opstate retry --stop``): it creates nothing
    more (its planned children become ``refused``; one a runner is creating right now is
    left to it) and stays ``active``, due now, so the next pass writes its final result once
    its batches are settled. Returns what became of it; ``StopRefusedError`` when ``name`` is
    no root with a lineage (unknown, a child, off or already done). A lost race is re-read,
    ``ATTACH_ATTEMPTS`` times at most."""
    for _ in range(ATTACH_ATTEMPTS):
        state = store.get_retry(name)
        if state is None:
            raise StopRefusedError(f"{name} has no retry policy: nothing to stop")
        if state.status == RETRY_MEMBER:
            root = state.doc.get("lineage")
            found = root.get("root") if isinstance(root, Mapping) else None
            raise StopRefusedError(f"{name} is a retry child: stop its root ({found})")
        if state.status != RETRY_ACTIVE or retry_view(state.doc)["status"] == "off":
            status = retry_view(state.doc)["status"]
            raise StopRefusedError(f"{name}'s retry is {status}: nothing to stop")
        if state.doc.get("stopped"):
            return "it was stopped already"
        doc = lineage.mutable(state.doc)
        doc["stopped"] = STOPPED_BY_OPERATOR
        for entry in lineage.children(doc):
            if entry.get("phase") == lineage.PLANNED:
                entry.update(phase=lineage.REFUSED, error="the lineage stopped", claimUntilNs=0)
        written = replace(state, doc=doc, due_ns=now_ns)
        if store.set_retry(name, state.rev, written):
            return "no more retry batches"
    raise StoreUnavailableError(
        f"the retry state of {name} changed under {ATTACH_ATTEMPTS} writes in a row"
    )
