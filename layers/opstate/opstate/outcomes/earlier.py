"""An earlier copy found under an operation's prefix: checked, never trusted.

A ``summary.json`` already under the prefix (a pass that wrote it and then lost its status
write, or something planted by whoever can write the storage) settles the archive without a
download from Gemini only when all of this holds:

- it is JSON naming this operation (``name``) and listing exactly the objects Gemini lists
  now, each at the location this sink gives its key;
- each object is there and, read back through a fresh ledger, has the bytes and sha256 the
  summary lists and what Gemini declared (its ``sizeBytes`` and ``sha256Hash``; for data in
  hand, those bytes); an object the sink refuses to read (a link out of its root) is not.

The summary then stored is built from that read (``summary.summary_of``): rows, errors and
usage recounted from the stored bytes, nothing taken from the file. Anything else is ignored
and the objects are copied again. Reading the objects back costs one read of the storage,
never a download from Gemini.
"""

from __future__ import annotations

import json
from typing import Any

from opstate.domain.model import OpRecord
from opstate.outcomes.copy import Ledger, mismatch, new_ledger
from opstate.outcomes.ledger import BatchLedger
from opstate.outcomes.plan import SUMMARY_KEY, prefix_of
from opstate.outcomes.sink import Sink, SinkError, StoredObject
from opstate.outcomes.source import Output, Outputs

MAX_SUMMARY_BYTES = 1024 * 1024


def _listed(sink: Sink, record: OpRecord, outputs: Outputs) -> list[Any] | None:
    """The objects a summary.json under the prefix lists, when it names ``record`` and lists
    as many objects as ``outputs``; else None."""
    raw = sink.read(f"{prefix_of(record)}/{SUMMARY_KEY}", MAX_SUMMARY_BYTES)
    if raw is None:
        return None
    try:
        summary = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(summary, dict) or summary.get("name") != record.name:
        return None
    objects = summary.get("objects")
    if not isinstance(objects, list) or len(objects) != len(outputs.items):
        return None
    return objects


def _read_back(
    sink: Sink, key: str, item: Output, listed: object, max_line_bytes: int
) -> tuple[StoredObject, Ledger] | None:
    """The stored object ``key`` read through a fresh ledger, when it is what ``listed`` (a
    summary's entry) says and what Gemini declared; else None."""
    if not isinstance(listed, dict) or listed.get("location") != sink.location(key):
        return None
    stored = sink.head(key)
    if stored is None or stored.size != listed.get("bytes"):
        return None
    if stored.sha256 and stored.sha256 != listed.get("sha256"):
        return None
    ledger = new_ledger(item, max_line_bytes)
    try:
        for chunk in sink.chunks(stored.location):
            ledger.feed(chunk)
    except SinkError:  # unreadable, or not under the sink's root (a link out): copy again
        return None
    if isinstance(ledger, BatchLedger):
        ledger.finish()
    if ledger.size != stored.size or ledger.sha256 != listed.get("sha256"):
        return None
    if mismatch(item, ledger.size, ledger.sha256) is not None:
        return None
    return StoredObject(stored.location, ledger.size, ledger.sha256), ledger


def earlier_copy(
    sink: Sink, record: OpRecord, outputs: Outputs, max_line_bytes: int
) -> tuple[list[StoredObject], BatchLedger | None] | None:
    """The objects of a complete earlier copy of ``outputs`` and the batch ledger recounted
    from it, or None (see the module docstring)."""
    listed = _listed(sink, record, outputs)
    if listed is None:
        return None
    objects: list[StoredObject] = []
    batch: BatchLedger | None = None
    for item, entry in zip(outputs.items, listed, strict=True):
        found = _read_back(sink, f"{prefix_of(record)}/{item.key}", item, entry, max_line_bytes)
        if found is None:
            return None
        objects.append(found[0])
        if isinstance(found[1], BatchLedger):
            batch = found[1]
    return objects, batch
