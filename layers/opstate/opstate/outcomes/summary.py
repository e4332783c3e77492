"""What an archive's summary holds, built from the archiver's own counts (never read back from
storage), every field bounded so that the archive state always fits beside its record in one
DynamoDB item (400 KB; the record's details are at most 64 KiB, ``opstate.domain.details``).

The bounds, each enforced here or where the value is made:

- error codes: at most ``plan.MAX_ERROR_CODES`` of them, each at most ``plan.MAX_CODE_CHARS``
  characters (the ledger cuts them while counting);
- every count (usage sums, ``requests``, ``filteredCount``) at most ``MAX_COUNT`` (an int64:
  a DynamoDB number holds 38 digits at most);
- objects: at most ``MAX_OBJECTS`` per operation (checked before anything is copied);
- content-filter reasons: at most ``MAX_REASONS``, each at most ``MAX_REASON_CHARS``;
- a location from the record (a Google Cloud job's output) at most ``MAX_LOCATION_CHARS``;
- ``usageBands`` (the ledger's sums per model and price band): at most
  ``ledger.MAX_BAND_MODELS`` + 2 models (one ``other``, one unnamed) times
  ``len(PRICE_TIER_STARTS) + 1`` bands;
- the whole state as compact JSON at most ``MAX_STATE_BYTES`` (``check_fits``), the last
  guard: a state past it is never written, the entry is ``failed`` instead.
"""

from __future__ import annotations

import json
from typing import Any

from opstate.domain.model import OpRecord
from opstate.outcomes.ledger import BatchLedger
from opstate.outcomes.plan import capped_errors
from opstate.outcomes.price import bands_of
from opstate.outcomes.sink import StoredObject
from opstate.outcomes.source import VIDEO, Outputs
from opstate.store.port import ArchiveState

MAX_COUNT = 2**63 - 1
MAX_OBJECTS = 100
MAX_REASONS = 16
MAX_REASON_CHARS = 512
MAX_LOCATION_CHARS = 2048
MAX_STATE_BYTES = 160 * 1024


class TooLargeError(Exception):
    """An archive state larger than ``MAX_STATE_BYTES`` (never written)."""


def bounded_count(value: int | None) -> int | None:
    """A count as the state keeps it: ``value`` clamped to ``0..MAX_COUNT``."""
    return None if value is None else max(0, min(int(value), MAX_COUNT))


def too_many(outputs: Outputs) -> str | None:
    """Why ``outputs`` cannot be archived as one (more than ``MAX_OBJECTS``), or None."""
    if len(outputs.items) > MAX_OBJECTS:
        return (
            f"Gemini lists {len(outputs.items)} objects, more than the {MAX_OBJECTS} "
            "one archive keeps"
        )
    return None


def bounded_location(location: str) -> str:
    """A location from the record as the state keeps it ("" when longer than the bound: a
    location cut short would name another place)."""
    return location if len(location) <= MAX_LOCATION_CHARS else ""


def summary_of(
    record: OpRecord,
    outputs: Outputs,
    objects: list[StoredObject],
    batch: BatchLedger | None,
) -> dict[str, Any]:
    """The summary of an archive (``ArchiveState.summary``, and ``summary.json`` with the
    name and times added), every field bounded (see the module docstring)."""
    summary: dict[str, Any] = {
        "kind": str(record.kind),
        "state": str(record.state),
        "objects": [o.as_dict() for o in objects],
        "rows": None,
        "errors": None,
        "usage": None,
        "requests": None,
    }
    if batch is not None:
        summary.update(
            rows=batch.rows.as_dict(),
            errors=capped_errors(batch.errors),
            usage={key: bounded_count(n) for key, n in batch.usage.items()},
            requests=bounded_count(outputs.requests),
            usageBands=bands_of(batch.bands),
        )
    videos = [i for i in outputs.items if i.what == VIDEO]
    if videos or outputs.filtered_count is not None:
        summary["videos"] = {
            "count": len(videos),
            "filteredCount": bounded_count(outputs.filtered_count or 0),
            "filteredReasons": [r[:MAX_REASON_CHARS] for r in outputs.filtered_reasons][
                :MAX_REASONS
            ],
        }
    return summary


def check_fits(state: ArchiveState) -> None:
    """Raise ``TooLargeError`` when ``state`` is larger than ``MAX_STATE_BYTES``."""
    size = len(json.dumps(state.as_dict(), separators=(",", ":")).encode("utf-8"))
    if size > MAX_STATE_BYTES:
        raise TooLargeError(
            f"the archive state would be {size} bytes, more than the {MAX_STATE_BYTES} "
            "it may take beside its record"
        )
