"""The gateway port on google-genai: ``GenaiGateway``, reconcile's ``Gateway`` over a
``google.genai.Client`` built on ``opstate.gemini`` (the key, ``make_client``, the REST batch
reads, ``classify``).

It imports the SDK inside functions, so ``import opstate.reconcile`` stays cheap for the CLI.

- ``webhooks``: ``client.webhooks.list()``, at most ``MAX_WEBHOOK_PAGES`` pages.
- ``batch_pages``: ``opstate.gemini.rest_batch_pages`` (the REST listing, one page per step,
  each job read as ``fetch`` reads one), so a listed batch keeps its progress too.
- ``fetch`` by kind: a batch's REST resource (``opstate.gemini.rest_batch``: ``GET
  batches/{id}``, ``metadata.batchStats`` kept as the ``batch_stats`` detail);
  ``operations.get`` with a ``GenerateVideosOperation`` (Veo) or an ``ImportFileOperation``
  (file-search imports and any other LRO: only name, done, error and response are read);
  ``interactions.get(<id>)``. The answer is normalised with the webhook path's normalisers and
  renamed to the record asked about.
- SDK exceptions become ``GatewayError`` (``opstate.gemini.classify``).

``make_client`` is re-exported for the callers that build this gateway (``opstate serve``'s
loop, the benchmarks).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opstate.domain.events import EventError, from_interaction, from_operation
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.names import Kind, api_name
from opstate.gemini.batches import rest_batch, rest_batch_pages
from opstate.gemini.client import make_client
from opstate.gemini.errors import classify
from opstate.reconcile.gateway import Listed, WebhookInfo

if TYPE_CHECKING:
    from google import genai

# Pages of webhooks read per call (50 per page by default: far more than any project has).
MAX_WEBHOOK_PAGES = 5


class GenaiGateway:
    """``Gateway`` over a ``google.genai.Client`` (see the module docstring)."""

    def __init__(self, client: genai.Client, *, owned: bool = True) -> None:
        """``owned``: ``close`` closes ``client`` (False: a client kept warm for later runs,
        ``opstate.gemini.client.warm_client``)."""
        self.client = client
        self.owned = owned
        self._lock = threading.Lock()
        self._interactions: Any = None

    def webhooks(self) -> Sequence[WebhookInfo]:
        found: list[WebhookInfo] = []
        try:
            page_token: str | None = None
            for _ in range(MAX_WEBHOOK_PAGES):
                listing = self.client.webhooks.list(page_token=page_token)
                for webhook in listing.webhooks or []:
                    state = webhook.state
                    found.append(
                        WebhookInfo(webhook.id, webhook.name, None if state is None else str(state))
                    )
                page_token = listing.next_page_token or None
                if not page_token:
                    break
        except Exception as exc:
            raise classify(exc) from exc
        return found

    def batch_pages(self, page_size: int) -> Iterator[Sequence[Listed]]:
        return rest_batch_pages(self.client, page_size)

    def fetch(self, record: OpRecord) -> OpEvent:
        try:
            event = self._fetch(record)
        except EventError:
            raise
        except Exception as exc:
            raise classify(exc) from exc
        if event.name != record.name:
            # We asked for this resource: whatever spelling came back, it is this record.
            event = replace(event, name=record.name)
        return event

    def _fetch(self, record: OpRecord) -> OpEvent:
        kind = record.kind
        if kind is Kind.BATCH:
            # The REST resource: the SDK's BatchJob drops batchStats (python-genai #1323).
            return rest_batch(self.client, record.name)
        if kind is Kind.INTERACTION:
            interaction_id = record.name.split("/", 1)[1]
            with self._lock:  # a lazily built sub-client: build it once, not in N threads
                if self._interactions is None:
                    self._interactions = self.client.interactions
                interactions = self._interactions
            return from_interaction(interactions.get(interaction_id))
        from google.genai import types

        operation: types.GenerateVideosOperation | types.ImportFileOperation
        if kind is Kind.VIDEO:
            # The key has no model (models/-/operations/<id>): put it back to ask for it.
            full_name = api_name(record.name, record.details)
            operation = types.GenerateVideosOperation.model_validate({"name": full_name})
        else:
            operation = types.ImportFileOperation.model_validate({"name": record.name})
        return from_operation(self.client.operations.get(operation))

    def close(self) -> None:
        if self.owned:
            self.client.close()


__all__ = ["MAX_WEBHOOK_PAGES", "GenaiGateway", "make_client"]
