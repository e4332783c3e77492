"""Wiring: settings -> store + gateways -> one run (the Lambda entry and the CLI call this).

The Google Cloud gateway is made only when Google Cloud is configured
(``Settings.google_cloud_configured``); it loads its credentials on its first request.
"""

from __future__ import annotations

from collections.abc import Callable

from opstate.config import Settings
from opstate.reconcile.cloud_gateway import GoogleCloudGateway
from opstate.reconcile.genai_gateway import GenaiGateway, make_client
from opstate.reconcile.run import DecisionHook, RunResult, reconcile_once
from opstate.store.port import PollingStore


def run_from_settings(
    settings: Settings,
    remaining_ms: Callable[[], int] | None = None,
    on_decision: DecisionHook | None = None,
) -> RunResult:
    """Open the configured store and a google-genai client, run once, close both."""
    from opstate.store import store_from_url

    store = store_from_url(settings.store_url, settings)
    try:
        if not isinstance(store, PollingStore):  # pragma: no cover - every store of ours is
            raise TypeError(f"{type(store).__name__} cannot schedule polls")
        gateway = GenaiGateway(make_client(settings))
        cloud = GoogleCloudGateway(settings) if settings.google_cloud_configured else None
        try:
            return reconcile_once(
                store,
                gateway,
                settings=settings,
                remaining_ms=remaining_ms,
                on_decision=on_decision,
                cloud=cloud,
            )
        finally:
            gateway.close()
            if cloud is not None:
                cloud.close()
    finally:
        store.close()
