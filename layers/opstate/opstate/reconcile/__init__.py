"""The reconciler: discover batch jobs, poll what is due, feed answers to ``ingest``.

One module per concern:

- ``gateway``: the port a run needs from Gemini (webhook health, batch pages, fetch one
  operation as an ``OpEvent``) and its ``GatewayError``;
- ``genai_gateway``: that port on google-genai (inside functions), built on ``opstate.gemini``
  (the API key, ``make_client``, the REST batch reads, ``classify``);
- ``cloud_gateway``: the ``CloudGateway`` port on google-genai's enterprise (Vertex AI) mode,
  one client per project/location; ``cloud_credentials``: its google-auth credentials
  (Secrets Manager or ``GOOGLE_APPLICATION_CREDENTIALS``; workload identity federation first),
  once ``cloud_credentials_policy`` (pure) accepts what their JSON says;
- ``pacing``: clock, token-bucket rate limit, shared backoff and breaker, time budget;
- ``schedule``: when an operation is next due, and when it is lost or overdue (pure);
- ``run``: one run, ``reconcile_once``, reporting through ``on_decision``; one operation's
  poll now, ``refresh_one`` (the same poll code, without the schedule); its phases:
  ``discovery`` (webhook health, the batch listings), ``polling`` (the due entries, one
  operation's poll), ``lanes`` (one per backend: rate limit, backoff, breaker, refusal) and
  ``runner`` (what the phases share: stop, report, pace, ingest);
- ``poll_writer``: writing what a poll decided (the next ``PollState`` with a batch's
  progress, polled or listed, each lost / overdue mark in its own write);
- ``tally``: what a run reports: ``RunResult``, ``MarkDecision``, its counters and metrics.

Its composition (``run_from_settings``, ``refresh_with``: the store, the gateways, the run and
the archive re-drive) is ``opstate.wiring.reconcile``, at the top.

Owns: the reconciler, one module per concern as above. May import the domain, ``config``,
``observability``, the store port, ``ingest``, ``opstate.gemini``, and google-genai /
google-auth (``genai_gateway``, ``cloud_gateway``, ``cloud_credentials`` only, inside
functions); never the outcomes, the API, the notifier, the wiring, the local server or the CLI.

Names are loaded on first use, so ``import opstate.reconcile`` stays cheap (no SDK, no boto3).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opstate.gemini.client import make_client
    from opstate.reconcile.cloud_gateway import GoogleCloudGateway
    from opstate.reconcile.gateway import (
        AuthError,
        CloudGateway,
        Gateway,
        GatewayError,
        WebhookInfo,
    )
    from opstate.reconcile.genai_gateway import GenaiGateway
    from opstate.reconcile.pacing import Backoff, Clock, SystemClock, TokenBucket
    from opstate.reconcile.run import Refreshed, reconcile_once, refresh_one
    from opstate.reconcile.schedule import Mark, Schedule
    from opstate.reconcile.tally import MarkDecision, RunDecision, RunResult

_WHERE = {
    "AuthError": "gateway",
    "CloudGateway": "gateway",
    "GoogleCloudGateway": "cloud_gateway",
    "Gateway": "gateway",
    "GatewayError": "gateway",
    "WebhookInfo": "gateway",
    "GenaiGateway": "genai_gateway",
    "make_client": "opstate.gemini.client",
    "Backoff": "pacing",
    "Clock": "pacing",
    "SystemClock": "pacing",
    "TokenBucket": "pacing",
    "MarkDecision": "tally",
    "RunDecision": "tally",
    "RunResult": "tally",
    "reconcile_once": "run",
    "Refreshed": "run",
    "refresh_one": "run",
    "Mark": "schedule",
    "Schedule": "schedule",
}

__all__ = [
    "AuthError",
    "Backoff",
    "Clock",
    "CloudGateway",
    "Gateway",
    "GatewayError",
    "GenaiGateway",
    "GoogleCloudGateway",
    "Mark",
    "MarkDecision",
    "Refreshed",
    "RunDecision",
    "RunResult",
    "Schedule",
    "SystemClock",
    "TokenBucket",
    "WebhookInfo",
    "make_client",
    "reconcile_once",
    "refresh_one",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'opstate.reconcile' has no attribute {name!r}")
    where = module if "." in module else f"opstate.reconcile.{module}"
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value
