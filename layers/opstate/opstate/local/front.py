"""What answers a request of ``opstate serve``: the API app (``LocalApp``: the Lambda's routes,
its decisions printed and kept for the page) and, in front of it, the operations page, the Host
check and the HTTP server (``http_server``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from opstate.api_token import API_TOKEN_ENV, ApiToken, bearer_token_ok
from opstate.config import Settings
from opstate.domain.model import Decision
from opstate.local.console import Console, DecisionLog
from opstate.local.options import ServeError, ServeOptions
from opstate.local.start_lines import change_line
from opstate.quarantine import Bounds, local_quarantine

if TYPE_CHECKING:
    from opstate.local.http_server import LocalHTTPServer
    from opstate.local.waiters import LocalWaiters
    from opstate.signatures import Verifier
    from opstate.store.port import Store


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


def _clear_metrics() -> None:
    from opstate.observability import metrics

    with contextlib.suppress(Exception):
        metrics.clear_metrics()


def local_app(
    store: Store,
    verifier: Verifier,
    settings: Settings,
    token: ApiToken,
    decisions: DecisionLog,
    say: Callable[[str], None],
    waiters: LocalWaiters | None = None,
) -> LocalApp:
    """The API app: every decision goes to the page's log, every state change is printed (and
    may resume waiters). The API token reports and tracks; only ``OPSTATE_RETRY_API_TOKEN``
    may also attach a retry policy (docs/security.md, "Acting")."""
    from opstate.api import create_app, require_bearer_token, retry_by_bearer

    retry_token = settings.retry_api_token
    if retry_token is not None and retry_token == token.token:
        raise ServeError(
            "OPSTATE_RETRY_API_TOKEN must differ from the API token: the same value would "
            "give the retry right to every holder of the API token"
        )

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
            operations_auth=require_bearer_token(token.token, retry_token),
            retry_right=retry_by_bearer(retry_token),
            registrar=waiters.registrar if waiters is not None else None,
            on_waiter=waiters.soon if waiters is not None else None,
        )
    )


def http_server(
    options: ServeOptions,
    settings: Settings,
    apps: LocalApp,
    store: Store,
    decisions: DecisionLog,
    token: ApiToken,
    say: Callable[[str], None],
    refresh: Callable[[str], tuple[int, dict[str, Any]]] | None = None,
) -> LocalHTTPServer:
    """The HTTP server (not started yet) with the page in front of the API (``refresh``: the
    page's "poll now", None without one); on failure the store is closed and a ``ServeError``
    says why."""
    # waitress is imported here, on start: the CLI imports opstate.local.serve (and so this
    # module) to build its parser.
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
        refresh=refresh,
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
