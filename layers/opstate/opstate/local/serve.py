"""``opstate serve``: the Lambda's API app behind a local, threaded HTTP server.

Each HTTP request becomes an API Gateway HTTP API (payload format 2.0) event and goes through
``opstate.api.create_app(...).resolve(event, context)`` — the same routes, signature checks and
JSON responses as in AWS. The embedded SQLite store is the default; the reconciler runs on a
timer when a Gemini API key is configured; every state change is printed as one line.

Shutdown (SIGINT / SIGTERM): end the reconciler pass's time budget (its in-flight Gemini
requests finish, nothing new starts), stop accepting, let in-flight HTTP requests finish, wait
for the reconciler thread, close the store. Everything acknowledged with a 200 has been written.

This module is the wiring; the parts live beside it: ``apigw`` (events and context),
``http_server`` (HTTP), ``secret_file`` (the local webhook secret) and ``reconcile_loop``
(the reconciler's timer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote

from opstate.api_token import API_TOKEN_ENV, ApiToken, bearer_token_ok
from opstate.config import DEFAULT_RECONCILE_EVERY_S, Settings
from opstate.domain.model import Decision
from opstate.domain.routes import OPERATIONS_PREFIX, WEBHOOK_PATH
from opstate.domain.times import format_time
from opstate.local.console import Console, DecisionLog
from opstate.local.reconcile_loop import ReconcileLoop, start_reconciler
from opstate.local.reconcile_loop import decision_line as reconcile_decision_line
from opstate.local.secret_file import (
    DEFAULT_SECRET_FILE,
    SecretFileReader,
    SecretSource,
    api_token_for,
    resolve_secrets,
)
from opstate.quarantine import Bounds, local_quarantine
from opstate.terminal import printable_lines

if TYPE_CHECKING:
    from opstate.local.http_server import LocalHTTPServer
    from opstate.local.waiters import LocalWaiters
    from opstate.reconcile.tally import RunDecision
    from opstate.signatures import Verifier
    from opstate.store.port import Store

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3000


class LocalApp:
    """The API app behind the local server.

    ``opstate.api``'s resolver keeps each request's state per thread, so one app instance
    serves every request thread in parallel.
    """

    def __init__(self, app: Any) -> None:
        self._app = app

    def resolve(self, event: dict[str, Any], context: Any) -> Mapping[str, Any]:
        try:
            result: Mapping[str, Any] = self._app.resolve(event, context)
        finally:
            _clear_metrics()
        return result


# --------------------------------------------------------------------------------------------
# Printing


class Printer:
    """Thread-safe line printer (stdout is shared by request and reconciler threads)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._broken = False

    def __call__(self, line: str) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                # Every line printed goes through the one escape (opstate.terminal).
                self._out.write(printable_lines(line) + "\n")
                self._out.flush()
            except (OSError, ValueError):
                # stdout went away (a closed pipe): keep serving and, above all, keep shutdown
                # working; printing is best effort.
                self._broken = True


def change_line(decision: Decision, now_ns: int | None = None) -> str | None:
    """``<time>  <name>  <previous> -> <new>  v<version>`` for a state change, else None."""
    if not decision.state_changed or decision.record is None:
        return None
    record = decision.record
    previous = str(decision.previous.state) if decision.previous is not None else "(new)"
    stamp = format_time(now_ns if now_ns is not None else time.time_ns())
    stamp = stamp[:19] + "Z"
    return f"{stamp}  {record.name}  {previous} -> {record.state}  v{record.version}"


def token_expression(token: ApiToken) -> str:
    """A shell expression for the API token, read at paste time (never the token itself)."""
    if token.origin == "file" and token.path is not None:
        return f"$(cat {shlex.quote(str(token.path))})"
    return f"${{{API_TOKEN_ENV}}}"


def track_example(base_url: str, token: ApiToken) -> str:
    """A ready-to-paste ``curl`` that tracks a job through the token-protected route."""
    return (
        f'curl -sS -X PUT -H "Authorization: Bearer {token_expression(token)}" '
        f"{base_url}{OPERATIONS_PREFIX}batches/<id>"
    )


def curl_example(base_url: str, source: SecretSource) -> str:
    """A ready-to-paste shell snippet that signs and posts a test webhook (openssl + curl)."""
    if source.origin == "file" and source.path is not None:
        secret_expr = f"$(head -n1 {shlex.quote(str(source.path))})"
    else:
        secret_expr = '"${OPSTATE_WEBHOOK_SECRETS%% *}"'
    url = f"{base_url}{WEBHOOK_PATH}"
    return "\n".join(
        [
            f"  secret={secret_expr}",
            "  id=msg_$RANDOM$RANDOM; ts=$(date +%s)",
            '  body=\'{"type":"batch.succeeded","version":"v1","timestamp":"\'"$(date -u'
            ' +%Y-%m-%dT%H:%M:%SZ)"\'","data":{"id":"batches/demo-1"}}\'',
            "  key=$(printf %s \"${secret#whsec_}\" | base64 -d | od -An -vtx1 | tr -d ' \\n')",
            '  sig=$(printf %s "$id.$ts.$body" | openssl dgst -sha256 -mac HMAC'
            ' -macopt "hexkey:$key" -binary | base64)',
            f"  curl -sS -X POST {url} -H 'content-type: application/json' \\",
            '    -H "webhook-id: $id" -H "webhook-timestamp: $ts"'
            ' -H "webhook-signature: v1,$sig" -d "$body"; echo',
        ]
    )


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    store_url: str | None = None
    reconcile_every_s: float = DEFAULT_RECONCILE_EVERY_S
    secret_file: Path = DEFAULT_SECRET_FILE
    verbose: bool = False
    # What chose the store (``OPSTATE_STORE``, ``--store``, ``the default``), for its line.
    store_chosen_by: str | None = None
    # Host names answered besides loopback and OPSTATE_PUBLIC_URL's (opstate.local.hosts).
    allow_hosts: tuple[str, ...] = ()


class ServeError(Exception):
    """An expected start-up failure (port in use, bad secret file): one sentence, exit 1."""


def _quiet_powertools(verbose: bool) -> None:
    """Locally, decisions are printed as lines: no EMF blobs, logs at warning level."""
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    from opstate.observability import logger

    if not verbose:
        logger.setLevel("WARNING")


def _clear_metrics() -> None:
    from opstate.observability import metrics

    with contextlib.suppress(Exception):
        metrics.clear_metrics()


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
    apps = _local_app(store, verifier, settings, token, decisions, say, waiters)
    httpd = _http_server(options, settings, apps, store, decisions, token, say)
    base_url = f"http://{httpd.host}:{httpd.port}"
    _print_start(say, options, store_url, source, token, base_url)
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


def _local_app(
    store: Store,
    verifier: Verifier,
    settings: Settings,
    token: ApiToken,
    decisions: DecisionLog,
    say: Callable[[str], None],
    waiters: LocalWaiters | None = None,
) -> LocalApp:
    """The API app: every decision goes to the page's log, every state change is printed (and
    may resume waiters)."""
    from opstate.api import create_app, require_bearer_token

    def on_decision(decision: Decision) -> None:
        decisions.add(decision)
        if waiters is not None:
            waiters.after(decision)
        line = change_line(decision)
        if line is not None:
            say(line)

    return LocalApp(
        create_app(
            store=store,
            verifier=verifier,
            settings=settings,
            on_decision=on_decision,
            # Signed webhooks that cannot be read are kept here (opstate replay --quarantine).
            quarantine=local_quarantine(
                settings.store_url,
                Bounds(settings.quarantine_max_entries, settings.quarantine_max_bytes),
            ),
            operations_auth=require_bearer_token(token.token),
            registrar=waiters.registrar if waiters is not None else None,
            on_waiter=waiters.soon if waiters is not None else None,
        )
    )


def _http_server(
    options: ServeOptions,
    settings: Settings,
    apps: LocalApp,
    store: Store,
    decisions: DecisionLog,
    token: ApiToken,
    say: Callable[[str], None],
) -> LocalHTTPServer:
    """The HTTP server (not started yet) with the page in front of the API; on failure the
    store is closed and a ``ServeError`` says why."""
    # waitress is imported here: the CLI builds its parser from this module's defaults.
    from opstate.local.hosts import AllowedHosts, HostCheck

    try:
        from opstate.local.http_server import ApiGatewayApp, LocalHTTPServer
    except ImportError as exc:
        store.close()
        raise ServeError(
            f"opstate serve needs waitress ({exc}); install it with "
            "pip install 'gemini-opstate[local]'"
        ) from None
    if not options.verbose:
        logging.getLogger("waitress").setLevel(logging.ERROR)  # queue depth, cancelled tasks

    wsgi_app = ApiGatewayApp(apps.resolve, say=say, verbose=options.verbose)
    # The page's data needs what the operations routes need: the API token.
    page = Console(
        wsgi_app,
        store=store,
        decisions=decisions,
        authorized=lambda headers: bearer_token_ok(headers.get("authorization"), token.token),
        token_help=_token_help(token),
        refresh=_refresher(store, settings, decisions, say),
    )
    # Only requests addressed to this server by a name it answers (DNS rebinding).
    allowed = AllowedHosts(options.host, settings.public_url, options.allow_hosts)
    try:
        return LocalHTTPServer(options.host, options.port, HostCheck(page, allowed))
    except OSError as exc:
        store.close()
        raise ServeError(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}"
        ) from None


def _token_help(token: ApiToken) -> dict[str, str | None]:
    """Where the page says the token is: the file's path, or the variable."""
    if token.origin == "file" and token.path is not None:
        return {"file": str(token.path), "variable": None}
    return {"file": None, "variable": API_TOKEN_ENV}


def _refresher(
    store: Store, settings: Settings, decisions: DecisionLog, say: Callable[[str], None]
) -> Callable[[str], tuple[int, dict[str, Any]]] | None:
    """The page's "poll now" button: ``opstate.reconcile.refresh_with`` on this server's
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


def _print_start(
    say: Callable[[str], None],
    options: ServeOptions,
    store_url: str,
    source: SecretSource,
    token: ApiToken,
    base_url: str,
) -> None:
    """Where things are: the store, the secret and token origins, the URLs, paste-ready tries."""
    chosen = f" (chosen by {options.store_chosen_by})" if options.store_chosen_by else ""
    say(f"opstate serve: store {store_url}{chosen}")
    _print_secret_origin(say, source)
    _print_token_origin(say, token)
    say(f"webhook URL: {base_url}{WEBHOOK_PATH}")
    say("  give Gemini the public https URL of a tunnel that forwards only this path, e.g.")
    say(f"  opstate webhooks register --url https://<your-tunnel>{WEBHOOK_PATH}")
    say("signed test webhook (paste into a shell):")
    say(curl_example(base_url, source))
    say(f"  # {FIRST_ANSWER}")
    say("the same signed delivery again, as Gemini retries it (paste into the same shell):")
    say(f"  {redeliver_example(base_url)}")
    say(f"  # {REDELIVERY_ANSWER}")
    say(f"track a job: {track_example(base_url, token)}")
    say(f"operations page: {page_link(base_url, token)}")
    say(f"  {page_hint(token)}")


# What the printed tries answer (the tests run them and check these).
FIRST_ANSWER = (
    'answers "applied":true, "reason":"created" (on later pastes "refreshed": '
    "its body time is new each time)"
)
REDELIVERY_ANSWER = (
    'answers "applied":false, "reason":"stale-or-equal-update-time": the redelivery is '
    "dropped, the record keeps its version"
)


def redeliver_example(base_url: str) -> str:
    """The ``curl`` that posts the delivery ``curl_example`` signed again, byte for byte (its
    ``$id``, ``$ts``, ``$sig`` and ``$body``), as Gemini's retry would."""
    return (
        f"curl -sS -X POST {base_url}{WEBHOOK_PATH} -H 'content-type: application/json' "
        '-H "webhook-id: $id" -H "webhook-timestamp: $ts" -H "webhook-signature: v1,$sig" '
        '-d "$body"; echo'
    )


def page_link(base_url: str, token: ApiToken) -> str:
    """The page's URL, with a generated (file) token in its fragment, as notebook servers
    print theirs: a browser never sends the fragment to a server. A token from
    ``OPSTATE_API_TOKEN`` is never echoed: the page asks for it."""
    if token.origin == "file":
        return f"{base_url}/#token={quote(token.token, safe='')}"
    return f"{base_url}/"


def page_hint(token: ApiToken) -> str:
    if token.origin == "file":
        return (
            f"the link carries the API token from {token.path} (the part after # stays in "
            "the browser, never sent to the server); the page says where the file is"
        )
    return f"the page asks for the API token: paste the value of {API_TOKEN_ENV}"


def _print_secret_origin(say: Callable[[str], None], source: SecretSource) -> None:
    if source.origin == "env":
        say(f"webhook secrets: {len(source.secrets)} from OPSTATE_WEBHOOK_SECRETS")
    elif source.generated:
        say(f"webhook secret (generated, saved in {source.path} with mode 0600):")
        say(f"  {source.secrets[0]}")
    else:
        say(f"webhook secrets: {len(source.secrets)} from {source.path}")
    for warning in source.warnings:
        say(f"warning: {warning}")


def _print_token_origin(say: Callable[[str], None], token: ApiToken) -> None:
    if token.origin == "env":
        say(f"API token (operations routes): from {API_TOKEN_ENV}")
    elif token.generated:
        say(f"API token (operations routes): generated, saved in {token.path} with mode 0600")
    else:
        say(f"API token (operations routes): from {token.path}")


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
