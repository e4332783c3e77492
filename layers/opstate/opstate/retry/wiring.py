"""Wiring: settings -> store + sink + google-genai client -> one retry pass, or one submit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opstate.config import Settings
from opstate.domain.retry import RetryPolicy
from opstate.retry.engine import retry_once
from opstate.retry.passes import RetryConfig, RetryResult
from opstate.retry.rules import parse_table
from opstate.retry.submit import Submitted, submit

MiB = 1024 * 1024


def config_from(settings: Settings) -> RetryConfig:
    """The pass's settings (``OPSTATE_RETRY_*``, the results' line cap)."""
    return RetryConfig(
        table=parse_table(settings.retry_transient),
        max_rows=settings.retry_max_rows,
        max_batches=settings.retry_max_batches,
        check_s=settings.retry_check_s,
        lease_s=settings.retry_lease_s,
        max_line_bytes=settings.results_max_line_mib * MiB,
    )


def _parts(settings: Settings, store: Any | None) -> tuple[Any, Any, bool]:
    from opstate.outcomes.wiring import results_url_for, sink_from_url
    from opstate.store import store_from_url

    sink = sink_from_url(results_url_for(settings), settings)
    opened = store is None
    used = store if store is not None else store_from_url(settings.store_url, settings)
    return used, sink, opened


def _client(settings: Settings) -> Any:
    from opstate.gemini.client import make_client

    return make_client(settings, timeout_s=settings.results_http_timeout_s)


def retry_from_settings(
    settings: Settings,
    remaining_s: Callable[[], float] | None = None,
    *,
    store: Any | None = None,
    names: list[str] | None = None,
    on_final: Callable[[str], None] | None = None,
    every: bool = False,
) -> RetryResult:
    """Open the configured store (unless given), the sink and a client; one pass; close what
    was opened here."""
    used, sink, opened = _parts(settings, store)
    try:
        client = _client(settings)
        try:
            return retry_once(
                used,
                sink,
                client,
                config_from(settings),
                remaining_s=remaining_s,
                safety_s=settings.reconcile_safety_margin_s,
                names=names,
                on_final=on_final,
                every=every,
            )
        finally:
            client.close()
    finally:
        if opened:
            used.close()


def submit_from_settings(
    settings: Settings,
    *,
    source: str,
    model: str,
    policy: RetryPolicy,
    display_name: str = "",
    store: Any | None = None,
) -> Submitted:
    """``opstate submit`` and the submit function: keep, upload, create, track."""
    used, sink, opened = _parts(settings, store)
    try:
        client = _client(settings)
        try:
            return submit(
                used,
                sink,
                client,
                source=source,
                model=model,
                policy=policy,
                display_name=display_name,
                max_line_bytes=settings.results_max_line_mib * MiB,
            )
        finally:
            client.close()
    finally:
        if opened:
            used.close()
