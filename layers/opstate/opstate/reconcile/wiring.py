"""Wiring: settings -> store + gateway -> one run (the Lambda entry and the CLI call this)."""

from __future__ import annotations

from collections.abc import Callable

from opstate.config import Settings
from opstate.model import OpRecord
from opstate.reconcile.genai_gateway import GenaiGateway, make_client
from opstate.reconcile.run import DecisionHook, Refreshed, RunResult, reconcile_once, refresh_one
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
        try:
            return reconcile_once(
                store,
                gateway,
                settings=settings,
                remaining_ms=remaining_ms,
                on_decision=on_decision,
            )
        finally:
            gateway.close()
    finally:
        store.close()


def refresh_with(
    store: PollingStore,
    settings: Settings,
    record: OpRecord,
    on_decision: DecisionHook | None = None,
) -> Refreshed:
    """``refresh_one`` on an open store with a google-genai client made for this one poll
    (``opstate refresh`` and the operations page's button)."""
    gateway = GenaiGateway(make_client(settings))
    try:
        return refresh_one(store, gateway, record, settings=settings, on_decision=on_decision)
    finally:
        gateway.close()
