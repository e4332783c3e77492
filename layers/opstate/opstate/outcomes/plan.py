"""The pure rules of archiving (no I/O): which backend keeps a job's output, where an
operation's objects go, its deadline, retries, and the ``opstate results --json`` shape.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from opstate.domain.costs import archive_cost
from opstate.domain.model import OpRecord
from opstate.domain.names import GOOGLE_CLOUD, backend_of
from opstate.domain.times import NS_PER_SECOND, format_time

SUMMARY_KEY = "summary.json"
# The longest wait between two attempts of a failed copy.
MAX_RETRY_S = 3600.0
# Failed rows are counted by code for at most this many codes (the rest under "other").
MAX_ERROR_CODES = 100
OTHER_CODES = "other"
# A code is counted under its first characters only, and the ledger tells at most this many
# codes apart while it counts (a new code after them counts under "other"): its memory and
# the archive state stay bounded whatever the output holds.
MAX_CODE_CHARS = 64
MAX_COUNTED_CODES = 1000
# A candidate that finished for one of these reasons (google-genai's ``FinishReason`` names, as
# the REST JSON spells them) was refused by a policy and carries no answer: a succeeded row
# whose every candidate did is counted ``blocked`` (``ledger.is_blocked``). The image models'
# refusals are among them (IMAGE_SAFETY, IMAGE_PROHIBITED_CONTENT, IMAGE_RECITATION), and the
# filters the SDK names (MODEL_ARMOR, ESCALATION, PUP_LIMITED_DISABLED). A candidate that
# finished with no content for a reason that names no policy (NO_IMAGE, IMAGE_OTHER, OTHER,
# STOP with no parts, MAX_TOKENS, ...) is an answer, counted ``succeeded`` only
# (docs/results.md, "Blocked rows").
BLOCKING_FINISH_REASONS = frozenset(
    {
        "SAFETY",
        "PROHIBITED_CONTENT",
        "BLOCKLIST",
        "SPII",
        "RECITATION",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
        "MODEL_ARMOR",
        "ESCALATION",
        "PUP_LIMITED_DISABLED",
    }
)
_UNSAFE = re.compile(r"[^A-Za-z0-9._/-]")


def is_cloud_job(name: str) -> bool:
    """A Google Cloud (Vertex AI) resource: its output stays in the user's GCS / BigQuery, so
    there is nothing to archive (``names.backend_of``)."""
    return backend_of(name) == GOOGLE_CLOUD


def prefix_of(record: OpRecord) -> str:
    """The folder of one record incarnation: its name, then its creation time (ns), as the
    idempotency key tells incarnations apart (``batches/abc/1780000000000000000``)."""
    safe = "/".join(p for p in _UNSAFE.sub("_", record.name).split("/") if p not in ("", ".", ".."))
    return f"{safe}/{record.created_ns}"


def terminal_ns(record: OpRecord) -> int:
    """When the operation ended: its server time, else when it was applied."""
    return record.update_time_ns or record.applied_ns


def deadline_ns(record: OpRecord, expiration_ns: int, retention_s: float) -> int:
    """When Gemini deletes the results: its own ``expirationTime`` when given, else the
    documented retention from the terminal time."""
    if expiration_ns > 0:
        return expiration_ns
    return terminal_ns(record) + int(retention_s * NS_PER_SECOND)


def retry_delay_s(attempts: int, base_s: float) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones (doubling, capped)."""
    return float(min(MAX_RETRY_S, base_s * 2 ** max(0, min(attempts - 1, 30))))


def capped_errors(errors: Mapping[str, int]) -> dict[str, int]:
    """Failed rows by code; past ``MAX_ERROR_CODES`` codes the rarest are summed as other."""
    ranked = sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = dict(ranked[:MAX_ERROR_CODES])
    rest = sum(n for _, n in ranked[MAX_ERROR_CODES:])
    if rest:
        kept[OTHER_CODES] = kept.get(OTHER_CODES, 0) + rest
    return kept


def _time(ns: object) -> str | None:
    return format_time(ns) if isinstance(ns, int) and ns > 0 else None


def rows_view(rows: object) -> object:
    """A summary's ``rows`` as shown: with ``blocked`` (after ``succeeded``) always. A summary
    written before the ledger counted blocked rows has none: shown as null, unknown (its lines
    were never looked at for it; an archived state is not recounted), never 0."""
    if not isinstance(rows, Mapping) or "blocked" in rows:
        return rows
    shown: dict[str, Any] = {}
    for key, value in rows.items():
        shown[key] = value
        if key == "succeeded":
            shown["blocked"] = None
    shown.setdefault("blocked", None)
    return shown


def results_view(name: str, archive: Mapping[str, Any]) -> dict[str, Any]:
    """The ``opstate results --json`` document of an archive state (``ArchiveState.as_dict``):
    exactly ``name, status, expiresAt, archivedAt, objects, rows, errors, usage, requests,
    cost`` (``rows`` as ``rows_view`` shows them; ``cost``: ``costs.archive_cost``)."""
    summary = archive.get("summary")
    summary = summary if isinstance(summary, Mapping) else {}
    objects = summary.get("objects")
    return {
        "name": name,
        "status": archive.get("status"),
        "expiresAt": _time(archive.get("deadline_ns")),
        "archivedAt": _time(archive.get("archived_ns")),
        "objects": [
            {"location": o.get("location"), "bytes": o.get("bytes"), "sha256": o.get("sha256")}
            for o in (objects if isinstance(objects, list) else [])
            if isinstance(o, Mapping)
        ],
        "rows": rows_view(summary.get("rows")),
        "errors": summary.get("errors"),
        "usage": summary.get("usage"),
        "requests": summary.get("requests"),
        "cost": archive_cost(archive),
    }


def record_results(archive: Mapping[str, Any]) -> dict[str, Any]:
    """The ``results`` of the record view: ``status``, ``expiresAt`` and ``location`` (of
    ``summary.json``, or where a Google Cloud job's output stays)."""
    return {
        "status": archive.get("status"),
        "expiresAt": _time(archive.get("deadline_ns")),
        "location": archive.get("location") or None,
    }
