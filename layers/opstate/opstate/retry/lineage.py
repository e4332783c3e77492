"""A root's lineage as its retry state's ``doc`` holds it (docs/retry.md): the members (the root
and the children created so far), the planned children, and the deterministic child ids.

Pure: mappings in, mappings and small value objects out. The engine (``opstate.retry.engine``)
reads a root's ``doc`` with these, changes a copy and writes it back under its revision.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PLANNED = "planned"
CREATING = "creating"
CREATED = "created"
REFUSED = "refused"  # Gemini refused to create it for money: the lineage stopped
PHASES = (PLANNED, CREATING, CREATED, REFUSED)
FINAL = "final"
PENDING = "pending"


@dataclass(frozen=True, slots=True)
class MemberRef:
    """One batch of a lineage: the root (attempt 0) or a created child, and the input it
    was given (a URI in the sink, its rows and bytes when known)."""

    name: str
    attempt: int
    input: str | None
    rows: int | None
    size: int | None


def child_id(root: str, root_created_ns: int, attempt: int, index: int) -> str:
    """``opstate-<h12>-a<attempt>-<index>``: the planned child's id, also its Gemini display
    name, so that a child created before a crash is found again by it."""
    digest = hashlib.sha256(f"{root}@{root_created_ns}".encode()).hexdigest()[:12]
    return f"opstate-{digest}-a{attempt}-{index}"


def mutable(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``doc`` to change and write back."""
    return copy.deepcopy(dict(doc))


def children(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The doc's children (the live list of a ``mutable`` copy; well-formed entries only)."""
    found = doc.get("children")
    if not isinstance(found, list):
        return []
    return [c for c in found if isinstance(c, dict) and isinstance(c.get("id"), str)]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def input_of(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    found = doc.get("input")
    return found if isinstance(found, Mapping) else {}


def members(root: str, doc: Mapping[str, Any]) -> list[MemberRef]:
    """The root, then the created children in the order they were planned."""
    kept = input_of(doc)
    location = kept.get("location")
    found = [
        MemberRef(
            root,
            0,
            location if isinstance(location, str) and location else None,
            _int(kept.get("rows")),
            _int(kept.get("bytes")),
        )
    ]
    for child in children(doc):
        name = child.get("name")
        if child.get("phase") == CREATED and isinstance(name, str) and name:
            found.append(
                MemberRef(
                    name,
                    _int(child.get("attempt")) or 0,
                    child.get("input") if isinstance(child.get("input"), str) else None,
                    _int(child.get("rows")),
                    _int(child.get("bytes")),
                )
            )
    return found


def unfinished(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Children planned but not yet known to exist (``planned`` or ``creating``)."""
    return [c for c in children(doc) if c.get("phase") in (PLANNED, CREATING)]


def highest_attempt(doc: Mapping[str, Any]) -> int:
    """The highest attempt planned so far (0: only the root)."""
    return max((_int(c.get("attempt")) or 0 for c in children(doc)), default=0)


def cancelled(doc: Mapping[str, Any]) -> list[str]:
    found = doc.get("cancelled")
    return [n for n in found if isinstance(n, str)] if isinstance(found, list) else []


def plan_children(
    doc: dict[str, Any],
    *,
    root: str,
    root_created_ns: int,
    attempt: int,
    inputs: Sequence[tuple[str, int, int, bool, str]],
) -> list[dict[str, Any]]:
    """Append planned children to ``doc`` (a ``mutable`` copy), one per
    ``(input URI, rows, bytes, whole, parent)``; returns them."""
    entries = doc.setdefault("children", [])
    added = []
    for location, rows, size, whole, parent in inputs:
        entry = {
            "id": child_id(root, root_created_ns, attempt, len(entries)),
            "attempt": attempt,
            "parent": parent,
            "name": None,
            "rows": rows,
            "bytes": size,
            "input": location,
            "whole": whole,
            "phase": PLANNED,
            "claims": 0,
            "claimUntilNs": 0,
            "error": None,
        }
        entries.append(entry)
        added.append(entry)
    return added


def find_child(doc: Mapping[str, Any], child: str) -> dict[str, Any] | None:
    """The entry of child id ``child`` in ``doc`` (a ``mutable`` copy's live entry)."""
    for entry in children(doc):
        if entry["id"] == child:
            return entry
    return None
