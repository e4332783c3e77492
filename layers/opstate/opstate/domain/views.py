"""The JSON views of a record and of a decision: one shape for the API, the CLI and the docs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.domain.model import Decision, OpRecord
from opstate.domain.names import backend_of
from opstate.domain.times import format_time

# The details key a batch's progress is kept under (``metadata.batchStats``, by the gateway).
PROGRESS_DETAIL = "batch_stats"


def record_to_json(
    record: OpRecord,
    results: Mapping[str, Any] | None = None,
    progress: Mapping[str, Any] | None = None,
    retry: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``{name, kind, backend, state, updateTime, version, source, details, createdAt,
    appliedAt}`` (``backend``: ``gemini-api`` or ``google-cloud``, see ``names.backend_of``),
    plus, when known, ``results`` (the archive's ``status``, ``expiresAt``, ``location``:
    ``opstate.outcomes.plan.record_results``) and ``progress`` (a batch's ``batchStats``:
    ``requestCount``, ``successfulRequestCount``, ``failedRequestCount``,
    ``pendingRequestCount``: the one the reconciler kept beside the record, else the
    record's own ``batch_stats`` detail), and, for a record with a retry state (``retry``: its
    ``doc``, ``opstate.store.retry_state``), its lineage ``parent``, ``root``, ``attempt`` and
    ``retry`` (a root's policy, status, children and kept input: ``domain.retry.retry_view``;
    null for a retry child, which takes its root's). Without a retry state none of the four is
    there: a record of an earlier release shows as it did.

    Times are canonical RFC3339 with 9 fractional digits; an unknown server time (0) is null.
    """
    view = _record_view(record)
    if results is not None:
        view["results"] = dict(results)
    if progress is None:
        kept = record.details.get(PROGRESS_DETAIL)
        progress = kept if isinstance(kept, Mapping) else None
    if progress is not None:
        view["progress"] = dict(progress)
    if retry is not None:
        # Imported for records that have a retry state only (the webhook's init never does).
        from opstate.domain.retry import is_member, lineage_of, retry_view

        view |= lineage_of(retry, record.name)
        view["retry"] = None if is_member(retry) else retry_view(retry)
    return view


def _record_view(record: OpRecord) -> dict[str, Any]:
    return {
        "name": record.name,
        "kind": str(record.kind),
        "backend": backend_of(record.name),
        "state": str(record.state),
        "updateTime": format_time(record.update_time_ns) if record.update_time_ns else None,
        "version": record.version,
        "source": str(record.source),
        "details": dict(record.details),
        "createdAt": format_time(record.created_ns) if record.created_ns else None,
        "appliedAt": format_time(record.applied_ns) if record.applied_ns else None,
    }


def decision_to_json(decision: Decision) -> dict[str, Any]:
    """``{applied, reason, name, state, version}``: the stored state and version after it."""
    record = decision.record
    return {
        "applied": decision.applied,
        "reason": str(decision.reason),
        "name": decision.event.name,
        "state": str(record.state) if record is not None else str(decision.event.state),
        "version": record.version if record is not None else 0,
    }
