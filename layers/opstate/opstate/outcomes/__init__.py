"""Outcomes: copy every operation's results into storage the user owns before Gemini deletes
them, and say what they held and what they cost.

One module per concern, shaped like ``opstate.reconcile``:

- ``ledger``: the pure part: rows, errors and token usage of a batch output computed while it
  streams, bytes and sha256 of each object (bytes in, counts out; no I/O);
- ``plan``: the pure rules: which objects an operation has, where they go (one prefix per
  record incarnation), its deadline, the ``opstate results --json`` shape (``results_view``);
- ``sink``: the port to the user's storage (``Sink``), with ``file_sink`` (a folder: temporary
  name, then rename) and ``s3_sink`` (boto3 multipart upload, aborted on failure);
- ``source``: the port to Gemini (``Source``: what an operation's outputs are, streaming a
  file into a writer), with ``genai_source`` on google-genai (``client.files.download``);
- ``price``: what an archived batch cost (genai-prices, per band and modality), and
  ``estimate``: at most what a batch's input rows will cost (``estimate_rows``: bytes in,
  dollars or null with why out; the retry budgets and the job queue's parts call it);
- ``run``: one archive pass, ``archive_once`` (idempotent; deadlines; claims);
- ``wiring``: ``archive_from_settings``, ``sink_from_url`` and ``results_json``.

Owns: the archive status beside each record (through the store port's ``ArchivingStore``),
the archived objects and their ``summary.json``. May import the domain, ``config``,
``observability``, the store port, boto3 (``s3_sink`` only), google-genai (``genai_source``
only, inside functions) and ``opstate.gemini`` (``genai_source``: the key, the client, the
batch and file reads); never the reconciler, the API, the notifier, the local server or the
CLI.

Names are loaded on first use, so ``import opstate.outcomes`` stays cheap (no SDK, no boto3).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opstate.outcomes.ledger import BatchLedger, VideoLedger
    from opstate.outcomes.ledger_reading import USAGE_FIELDS

_WHERE = {
    "USAGE_FIELDS": "ledger_reading",
    "BatchLedger": "ledger",
    "VideoLedger": "ledger",
}

__all__ = ["USAGE_FIELDS", "BatchLedger", "VideoLedger"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'opstate.outcomes' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"opstate.outcomes.{module}"), name)
    globals()[name] = value
    return value
