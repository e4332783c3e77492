"""A root's lineage as its retry state's ``doc`` holds it (docs/retry.md): the members (the root
and the children created so far), the planned children and their ids.

A child's id carries a random nonce (``secrets.token_hex(16)``) written into the plan before
the child is created (issue 38). It is never shown to Gemini (issue 47): a display name is
public to every key of the project, so the child's batch and upload are named
``public_name(id)`` (a one-way tag of the id, the attempt and index), and the child is found
again by the upload its claim recorded (``upload``: ``{"file", "model", "claimedNs"}``),
never by a name. The previous release named them after the id. A plan written by the
previous release holds ids derived from the root's name and creation time
(``legacy_child_id``, no ``nonce``); the creator gives such an entry a nonce id when it claims
it (``opstate.retry.children``).

Pure: mappings in, mappings and small value objects out. The engine (``opstate.retry.engine``)
reads a root's ``doc`` with these, changes a copy and writes it back under its revision.
"""

from __future__ import annotations

import copy
import hashlib
import secrets
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
    sha256: str | None = None


@dataclass(frozen=True, slots=True)
class ChildInput:
    """What a planned child is given: its input in the sink (rows, bytes, sha256), whether it
    is a member's whole input, the member it comes from, the model Gemini said that member
    runs on, and its id when its input file was named after it (else one is drawn)."""

    location: str
    rows: int
    size: int
    whole: bool
    parent: str
    sha256: str | None
    model: str | None
    id: str | None = None


def new_child_id(attempt: int, index: int) -> tuple[str, str]:
    """``(id, nonce)``: ``opstate-<nonce>-a<attempt>-<index>``, the nonce 32 random hex
    digits; the id is also the child's Gemini display name (found again by it after a crash,
    adopted only after its own resource is read)."""
    nonce = secrets.token_hex(16)
    return f"opstate-{nonce}-a{attempt}-{index}", nonce


def public_name(child: str) -> str:
    """What Gemini is shown for child id ``child`` (its batch's and its upload's display name):
    ``opstate-retry-<tag>-a<attempt>-<index>``, the tag the first 12 hex digits of the id's
    sha256 (one-way: it tells which plan entry a batch is for, never the nonce). Every key of
    the project can read and copy it: it is a label, never evidence."""
    tail = child.split("-", 2)[-1] if child.count("-") >= 3 else "a0-0"
    tag = hashlib.sha256(child.encode()).hexdigest()[:12]
    return f"opstate-retry-{tag}-{tail}"


def upload_of(entry: Mapping[str, Any]) -> str | None:
    """The upload (``files/<id>``) a claim of ``entry`` recorded before its create, if any."""
    upload = entry.get("upload")
    found = upload.get("file") if isinstance(upload, Mapping) else None
    return found if isinstance(found, str) and found.startswith("files/") else None


def legacy_child_id(root: str, root_created_ns: int, attempt: int, index: int) -> str:
    """The previous release's id ``opstate-<h12>-a<attempt>-<index>`` (from the root's name
    and creation time: guessable). Only read: a stored plan may hold it."""
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


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


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
            _text(kept.get("sha256")),
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
                    _text(child.get("sha256")),
                )
            )
    return found


def unfinished(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Children planned but not yet known to exist (``planned`` or ``creating``)."""
    return [c for c in children(doc) if c.get("phase") in (PLANNED, CREATING)]


def highest_attempt(doc: Mapping[str, Any]) -> int:
    """The highest attempt planned so far (0: only the root)."""
    return max((_int(c.get("attempt")) or 0 for c in children(doc)), default=0)


def names_of(doc: Mapping[str, Any], key: str) -> list[str]:
    found = doc.get(key)
    return [n for n in found if isinstance(n, str)] if isinstance(found, list) else []


def cancelled(doc: Mapping[str, Any]) -> list[str]:
    """The members opstate cancelled for their pending timeout."""
    return names_of(doc, "cancelled")


def unknown(doc: Mapping[str, Any]) -> list[str]:
    """The members Gemini answered 404 for when opstate read them before acting."""
    return names_of(doc, "unknown")


def plan_children(
    doc: dict[str, Any],
    *,
    attempt: int,
    inputs: Sequence[ChildInput],
) -> list[dict[str, Any]]:
    """Append planned children to ``doc`` (a ``mutable`` copy), one per ``ChildInput``, each
    with its id and nonce (drawn now unless its input was named after one); returns them."""
    entries = doc.setdefault("children", [])
    added = []
    for given in inputs:
        child, nonce = new_child_id(attempt, len(entries))
        if given.id is not None:
            child, nonce = given.id, given.id.split("-")[1]
        entry = {
            "id": child,
            "nonce": nonce,
            "attempt": attempt,
            "parent": given.parent,
            "name": None,
            "rows": given.rows,
            "bytes": given.size,
            "sha256": given.sha256,
            "model": given.model,
            "input": given.location,
            "whole": given.whole,
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
