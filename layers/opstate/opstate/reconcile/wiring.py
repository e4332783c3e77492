"""Wiring: settings -> store + gateway -> one run (the Lambda entry and the CLI call this), then
the archive re-drive (``opstate.outcomes.redrive``)."""

from __future__ import annotations

from collections.abc import Callable

from opstate.config import Settings
from opstate.outcomes.redrive import redrive
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
        try:
            result = reconcile_once(
                store,
                gateway,
                settings=settings,
                remaining_ms=remaining_ms,
                on_decision=on_decision,
            )
        finally:
            gateway.close()
        # Pending archives whose trigger was lost: handed to the archiver, within the budget.
        left = (lambda: remaining_ms() / 1000.0) if remaining_ms is not None else None
        redrive(store, settings, remaining_s=left)
        return result
    finally:
        store.close()
