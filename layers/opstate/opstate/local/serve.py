"""``opstate serve``: the Lambda's API app behind a local, threaded HTTP server.

Each HTTP request becomes an API Gateway HTTP API (payload format 2.0) event and goes through
``opstate.api.create_app(...).resolve(event, context)`` — the same routes, signature checks and
JSON responses as in AWS. The embedded SQLite store is the default; the reconciler runs on a
timer when a Gemini API key is configured; every state change is printed as one line.

Shutdown (SIGINT / SIGTERM): end the reconciler pass's time budget (its in-flight Gemini
requests finish, nothing new starts), stop accepting, let in-flight HTTP requests finish, wait
for the reconciler thread, close the store. Everything acknowledged with a 200 has been written.

This module is the wiring (the start, the loops beside the server, the shutdown); the parts live
beside it: ``options`` (what serve is started with, how a start fails), ``front`` (the API app,
the page and the HTTP server in front of it), ``start_lines`` (what is printed), ``apigw``
(events and context), ``http_server`` (HTTP), ``secret_file`` (the local webhook secret),
``reconcile_loop`` (the reconciler's timer) and ``waiters`` (the local waiters).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from opstate.api_token import ApiToken
from opstate.config import Settings
from opstate.local.console import DecisionLog
from opstate.local.front import LocalApp, http_server, local_app
from opstate.local.options import ServeError, ServeOptions
from opstate.local.reconcile_loop import ReconcileLoop, start_reconciler
from opstate.local.reconcile_loop import decision_line as reconcile_decision_line
from opstate.local.secret_file import (
    SecretFileReader,
    SecretSource,
    api_token_for,
    resolve_secrets,
)
from opstate.local.start_lines import Printer, print_start

if TYPE_CHECKING:
    from opstate.local.http_server import LocalHTTPServer
    from opstate.reconcile.tally import RunDecision
    from opstate.signatures import Verifier
    from opstate.store.port import Store

# What the CLI and the benchmarks import from here (defined beside it).
__all__ = [
    "LocalApp",
    "ServeError",
    "ServeOptions",
    "serve",
]


def _quiet_powertools(verbose: bool) -> None:
    """Locally, decisions are printed as lines: no EMF blobs, logs at warning level."""
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    from opstate.observability import logger

    if not verbose:
        logger.setLevel("WARNING")


def serve(options: ServeOptions, settings: Settings, out: TextIO = sys.stdout) -> int:
    """Run the local server until SIGINT / SIGTERM; returns the process exit code."""
    say = Printer(out)
    _quiet_powertools(options.verbose)

    from opstate.store import store_from_url

    store_url = options.store_url or settings.store_url
    settings = dataclasses.replace(settings, store_url=store_url)
    source, token = _credentials(settings, options.secret_file)
    verifier = _verifier(source, settings)

    store = store_from_url(store_url, settings)
    _check_store(store)
    _purge_expired(store, say)

    # The operations page (opstate.local.console) shows the decisions this server took.
    decisions = DecisionLog()
    # Built now: configuration errors surface before "listening".
    from opstate.local.waiters import LocalWaiters

    waiters = LocalWaiters(store, settings)
    apps = local_app(store, verifier, settings, token, decisions, say, waiters)
    refresh = _refresher(store, settings, decisions, say)
    httpd = http_server(options, settings, apps, store, decisions, token, say, refresh)
    base_url = f"http://{httpd.host}:{httpd.port}"
    print_start(say, options, store_url, source, token, base_url)
    if settings.public_url:  # as in the Lambda: JWTs for this audience are verified too
        say(f"dynamic webhooks (JWT): on, audience {settings.public_url}")

    loop: ReconcileLoop | None = None
    if settings.gemini_api_key or settings.gemini_api_key_secret_arn:
        loop = start_reconciler(
            store,
            settings,
            options.reconcile_every_s,
            say,
            also=_both(decisions.add, waiters.after),
            on_final=waiters.soon,
        )
    else:
        say("reconciler: off (set GEMINI_API_KEY to poll Gemini)")
    try:
        _run_until_signalled(httpd, loop, store, say, base_url)
    finally:
        waiters.stop()
    return 0


def _both(*hooks: Callable[[Any], None]) -> Callable[[Any], None]:
    def each(decision: Any) -> None:
        for hook in hooks:
            hook(decision)

    return each


def _credentials(settings: Settings, secret_file: Path) -> tuple[SecretSource, ApiToken]:
    """The webhook secret source and the API token, or a ``ServeError`` naming which failed."""
    try:
        source = resolve_secrets(settings, secret_file)
    except (OSError, ValueError) as exc:
        raise ServeError(f"cannot set up the webhook secret: {exc}") from None
    try:
        token = api_token_for(settings, secret_file)
    except (OSError, ValueError) as exc:
        raise ServeError(f"cannot set up the API token: {exc}") from None
    return source, token


def _verifier(source: SecretSource, settings: Settings) -> Verifier:
    """As the Lambda verifies: Standard Webhooks, and with ``OPSTATE_PUBLIC_URL`` set the JWT
    of dynamic webhooks too (``signatures.WebhookVerifier``, the same audience, issuers and
    JWKS). A secret file is re-read as it changes (rotation); environment secrets are fixed."""
    from opstate.signatures import (
        SecretsProviderVerifier,
        StaticSecretsVerifier,
        WebhookVerifier,
        jwt_verifier_from_settings,
    )

    standard: Verifier
    if source.origin == "file" and source.path is not None:
        standard = SecretsProviderVerifier(
            SecretFileReader(source.path),
            tolerance_s=settings.webhook_tolerance_s,
            where=f"the webhook secret file {source.path}",
        )
    else:
        standard = StaticSecretsVerifier(source.secrets, tolerance_s=settings.webhook_tolerance_s)
    return WebhookVerifier(standard, jwt_verifier_from_settings(settings))


def _check_store(store: Store) -> None:
    """One read before serving, so that a store that cannot be used (no credentials, no
    table) fails the start with one sentence instead of every request later."""
    try:
        store.get(_PROBE_NAME)
    except BaseException:
        store.close()
        raise


_PROBE_NAME = "batches/opstate-serve-start-check"


def _purge_expired(store: Store, say: Callable[[str], None]) -> None:
    """SQLite has no TTL of its own: terminal records past their expires_at (applied time +
    OPSTATE_RETENTION_DAYS when written) are removed at start-up."""
    purge_expired = getattr(store, "purge_expired", None)
    if callable(purge_expired):
        purged = purge_expired()
        if purged:
            say(f"retention: removed {purged} terminal record(s) past their expires_at")


def _refresher(
    store: Store, settings: Settings, decisions: DecisionLog, say: Callable[[str], None]
) -> Callable[[str], tuple[int, dict[str, Any]]] | None:
    """The page's "poll now" button: ``opstate.wiring.reconcile.refresh_with`` on this server's
    store, its decision kept for the page and printed like the reconciler's (None without a
    Gemini API key)."""
    if not (settings.gemini_api_key or settings.gemini_api_key_secret_arn):
        return None

    def on_decision(decision: RunDecision) -> None:
        decisions.add(decision)
        line = reconcile_decision_line(decision, time.time_ns())
        if line is not None:
            say(line)

    def refresh(name: str) -> tuple[int, dict[str, Any]]:
        from opstate.store.port import PollingStore
        from opstate.wiring.reconcile import refresh_with

        record = store.get(name)
        if record is None or not isinstance(store, PollingStore):
            return 404, {"error": "not-found", "message": f"no operation named {name!r} is tracked"}
        refreshed = refresh_with(store, settings, record, on_decision=on_decision)
        return 200, {**refreshed.as_dict(), "message": refreshed.sentence()}

    return refresh


def _run_until_signalled(
    httpd: LocalHTTPServer,
    loop: ReconcileLoop | None,
    store: Store,
    say: Callable[[str], None],
    base_url: str,
) -> None:
    """Serve until SIGINT / SIGTERM, then shut down in order (see the module docstring)."""
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    # Installed for the rest of the process: a repeated signal during shutdown changes nothing.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    httpd.start()
    say(f"listening on {base_url}")
    try:
        while not stopping.wait(0.5):
            pass
    finally:
        if loop is not None:
            loop.request_stop()  # the pass's budget ends now: nothing new starts
        say("stopping: finishing in-flight requests")
        httpd.shutdown()  # stops accepting, finishes in-flight requests, closes connections
        if loop is not None:
            loop.stop()
        store.close()
        say("stopped")
