"""What the record view and ``opstate results`` show of a record's archive (store reads only;
no SDK, no boto3: the API and the CLI import it)."""

from __future__ import annotations

from typing import Any

from opstate.outcomes.plan import record_results, results_view
from opstate.store.port import ArchivingStore, RetryingStore, Store


def record_results_of(store: Store, name: str) -> dict[str, Any] | None:
    """The record view's ``results`` of ``name`` (None: no archive status yet)."""
    if not isinstance(store, ArchivingStore):
        return None
    state = store.get_archive(name)
    return None if state is None else record_results(state.as_dict())


def record_outcome(store: Store, name: str) -> tuple[dict[str, Any] | None, dict[str, int] | None]:
    """The record view's ``results`` and ``progress`` of ``name`` (None: not known)."""
    if not isinstance(store, ArchivingStore):
        return None, None
    return record_results_of(store, name), store.get_progress(name)


def results_json(store: Store, name: str) -> dict[str, Any] | None:
    """The ``opstate results --json`` document of ``name``: ``{name, status, expiresAt,
    archivedAt, objects, rows, errors, usage, requests}``, or None when no archive status is
    known yet (not tracked, still running, or terminal and not yet looked at).

    A retry root (docs/retry.md) adds ``lineage`` (its name, then its retry batches' in
    attempt order) and ``final`` (``domain.retry.final_view``: the one result per request
    key, ``pending`` until written); any other record's document is as before."""
    if not isinstance(store, ArchivingStore):
        return None
    state = store.get_archive(name)
    if state is None:
        return None
    view = results_view(name, state.as_dict())
    retry = store.get_retry(name) if isinstance(store, RetryingStore) else None
    if retry is not None:
        from opstate.domain.retry import final_view, is_member, lineage_names

        if not is_member(retry.doc):
            view["lineage"] = lineage_names(retry.doc, name)
            view["final"] = final_view(retry.doc)
    return view
