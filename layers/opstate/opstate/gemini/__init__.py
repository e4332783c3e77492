"""Talking to Gemini: the one package below both of its users (the reconciler and the outcomes).

One module per concern:

- ``port``: ``GeminiClient``, what opstate calls on a Gemini client (``batches``, ``files``
  and the one private REST request), which a real ``google.genai.Client`` fills (mypy checks
  it); the acting rooms take it, never ``Any``;
- ``client``: the Gemini API key (Secrets Manager or ``GEMINI_API_KEY``) and ``make_client``;
- ``batches``: reading batch jobs, the REST resource with its ``batchStats`` (``rest_batch``,
  ``rest_batch_pages``, ``batch_stats``) and the SDK's pager (``batch_job_pages``);
- ``files``: the Files API: what a file declares (``file_info``: size, sha256, expiration)
  and streaming its bytes (``download``), file names and Gemini's ``sha256Hash``;
- ``errors``: ``GatewayError`` and ``classify`` (an SDK exception as a status, transient or
  not, ``Retry-After`` and what the server said).
- ``submit`` (imported by its full name): uploading a JSONL input, creating, cancelling and
  reading a batch, finding batches by the id in their display name, ``create_refusal``.

Owns the low-level Gemini pieces above: the key, the client, the batch reads, the file reads
and the error classification. The reconciler's port adapters
(``opstate.reconcile.genai_gateway``, ``cloud_gateway``) and the archiver's source
(``opstate.outcomes.genai_source``) are built on them.
May import the domain, ``config`` and ``observability``, and google-genai and Powertools'
parameters (inside functions only); never the store, the reconciler, the outcomes, the API or
anything above them.

Names are loaded on first use, so ``import opstate.gemini`` stays cheap (no SDK, no boto3);
the webhook function never imports this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opstate.gemini.batches import (
        Listed,
        batch_job_pages,
        batch_stats,
        rest_batch,
        rest_batch_event,
        rest_batch_pages,
    )
    from opstate.gemini.client import api_key, make_client
    from opstate.gemini.errors import GatewayError, classify, retry_after_s
    from opstate.gemini.files import FileInfo, download, file_info, file_name_of, sha256_hex

_WHERE = {
    "Listed": "batches",
    "batch_job_pages": "batches",
    "batch_stats": "batches",
    "rest_batch": "batches",
    "rest_batch_event": "batches",
    "rest_batch_pages": "batches",
    "api_key": "client",
    "make_client": "client",
    "GatewayError": "errors",
    "classify": "errors",
    "retry_after_s": "errors",
    "FileInfo": "files",
    "download": "files",
    "file_info": "files",
    "file_name_of": "files",
    "sha256_hex": "files",
}

__all__ = [
    "FileInfo",
    "GatewayError",
    "Listed",
    "api_key",
    "batch_job_pages",
    "batch_stats",
    "classify",
    "download",
    "file_info",
    "file_name_of",
    "make_client",
    "rest_batch",
    "rest_batch_event",
    "rest_batch_pages",
    "retry_after_s",
    "sha256_hex",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'opstate.gemini' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"opstate.gemini.{module}"), name)
    globals()[name] = value
    return value
