"""One event shape for every source of truth, and one normaliser per source.

Sources: Gemini webhook bodies, google-genai ``BatchJob`` objects (Gemini API batches and
Google Cloud batch prediction jobs, whose ``outputInfo`` and ``completionStats`` are kept),
long-running ``Operation`` objects (Veo video on either backend, file-search imports),
interactions, and generic reports from the user's
own producer. Normalisers are duck-typed: they read attributes or mapping keys and never import
google-genai, so they stay pure and cheap to import.

This module is the one import for callers; the normalisers live beside it, one module per kind
of source:

- ``events_parsing``: the refusals, ``Source``, and the parsing of names, times and fields
  every normaliser shares (``check_future_skew`` too);
- ``events_webhook``: the pushed sources, ``from_webhook`` and ``from_pubsub``;
- ``events_polls``: the polled sources, ``from_batch_job``, ``from_operation`` and
  ``from_interaction``;
- ``events_report``: the user's own reports, ``from_report``.

Two kinds of refusal:
- ``InvalidEventError`` (``code`` = ``invalid-body``, ``missing-field``, ``invalid-name``,
  ``invalid-time``, ``invalid-state``, ``invalid-details``): the input is malformed; answer
  400 and write nothing.
  A report's details are checked strictly (``details.check``): what no store can hold is
  ``invalid-details``. Other sources' details are normalised by the reducer instead, so
  Gemini's state always applies.
- ``UnsupportedEventError`` (``reason`` = ``unsupported-event-type`` or ``unknown-state``): a
  well-formed input that this system deliberately does not turn into a state (a source added a
  type or state). It must never roll anything back; webhooks answer 200 with ``applied: false``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from opstate.domain.events_parsing import (
    UNKNOWN_STATE,
    UNSUPPORTED_EVENT_TYPE,
    EventError,
    InvalidEventError,
    Source,
    UnsupportedEventError,
    check_future_skew,
)
from opstate.domain.events_report import from_report
from opstate.domain.events_webhook import (
    WEBHOOK_DETAIL_FIELDS,
    WEBHOOK_FAMILIES,
    WEBHOOK_TYPES,
    from_pubsub,
    from_webhook,
    webhook_kind_hint,
)

if TYPE_CHECKING:
    from opstate.domain.events_polls import (
        COMPLETION_STATS,
        COMPLETION_STATS_FIELDS,
        INTERACTION_REASONS,
        INTERACTION_STATUSES,
        JOB_STATES,
        OUTPUT_LOCATION,
        RAI_FILTERED_COUNT,
        RAI_FILTERED_REASONS,
        RPC_CANCELLED,
        RPC_OK,
        from_batch_job,
        from_interaction,
        from_operation,
    )

__all__ = [
    "COMPLETION_STATS",
    "COMPLETION_STATS_FIELDS",
    "INTERACTION_REASONS",
    "INTERACTION_STATUSES",
    "JOB_STATES",
    "OUTPUT_LOCATION",
    "RAI_FILTERED_COUNT",
    "RAI_FILTERED_REASONS",
    "RPC_CANCELLED",
    "RPC_OK",
    "UNKNOWN_STATE",
    "UNSUPPORTED_EVENT_TYPE",
    "WEBHOOK_DETAIL_FIELDS",
    "WEBHOOK_FAMILIES",
    "WEBHOOK_TYPES",
    "EventError",
    "InvalidEventError",
    "Source",
    "UnsupportedEventError",
    "check_future_skew",
    "from_batch_job",
    "from_interaction",
    "from_operation",
    "from_pubsub",
    "from_report",
    "from_webhook",
    "webhook_kind_hint",
]


def __getattr__(name: str) -> Any:
    """A polled source's name (``events_polls``), loaded on first use: only the reconciler, the
    CLI and a Pub/Sub push read polled sources, so the webhook's init (which imports this module
    for ``from_webhook`` and ``from_report``) does not load it (docs/api.md, "Cold start").
    Every other name in ``__all__`` is imported above, so never reaches here."""
    if name not in __all__:
        raise AttributeError(f"module 'opstate.domain.events' has no attribute {name!r}")
    value = getattr(importlib.import_module("opstate.domain.events_polls"), name)
    globals()[name] = value
    return value
