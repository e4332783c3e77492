"""``create_app``: the routes wired onto one ``Router``, with the JSON error answers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from opstate.api.auth import OperationsAuth, RetryRight, require_iam_caller, retry_by_setting
from opstate.api.errors import ApiError, json_response
from opstate.api.ingesting import Ingester
from opstate.api.lazy import OnFirstUse
from opstate.api.operations import OPERATIONS_ROUTE, OperationsRoutes
from opstate.api.router import Request, Response, Router
from opstate.api.webhook import Keeper, QuarantineOnFirstUse, WebhookReceiver
from opstate.config import Settings
from opstate.domain.model import Decision
from opstate.domain.routes import PUBSUB_PATH, WEBHOOK_PATH
from opstate.observability import logger
from opstate.signatures import Verifier
from opstate.store.port import Store

if TYPE_CHECKING:
    from opstate.api.pubsub import PubSubReceiver
    from opstate.waiters.run import Registrar


def create_app(
    *,
    store: Store,
    verifier: Verifier,
    settings: Settings,
    clock_ns: Callable[[], int] = time.time_ns,
    on_decision: Callable[[Decision], None] | None = None,
    quarantine: Keeper | None = None,
    operations_auth: OperationsAuth = require_iam_caller,
    retry_right: RetryRight | None = None,
    pubsub_verifier: Verifier | None = None,
    registrar: Registrar | None = None,
    registrar_factory: Callable[[], Registrar | None] | None = None,
    on_waiter: Callable[[str], None] | None = None,
) -> Router:
    """The API's router over ``store``; ``on_decision`` sees every decision taken;
    ``operations_auth`` admits or refuses each operations request (default: AWS IAM);
    ``retry_right`` says whether an admitted one may attach a retry policy (default: the
    setting ``OPSTATE_RETRY_OVER_API``; docs/security.md, "Acting"); signed
    webhooks that cannot be read are kept in ``quarantine`` (default: logged whole); Pub/Sub
    pushes meet ``pubsub_verifier`` (default: the one the settings describe, else refused);
    waiters are kept by ``registrar``, or by the one ``registrar_factory`` builds on the first
    report that names a waiter (None: waiters refused).

    The Pub/Sub receiver is built on the first push: a webhook or operations request never
    imports its code (nor PyJWT, which its verifier uses)."""
    if registrar is not None and registrar_factory is not None:
        raise ValueError("give a registrar or a registrar_factory, not both")
    ingest = Ingester(store, settings.ingest_max_attempts, clock_ns, on_decision)
    kept = quarantine if quarantine is not None else QuarantineOnFirstUse(_log_quarantine)
    receiver = WebhookReceiver(
        verifier=verifier,
        ingest=ingest,
        quarantine=kept,
        max_bytes=settings.max_body_bytes,
        clock_ns=clock_ns,
    )

    def pubsub_receiver() -> PubSubReceiver:
        from opstate.api.pubsub import NotConfigured, PubSubReceiver
        from opstate.signatures import pubsub_verifier_from_settings

        chosen = pubsub_verifier
        if chosen is None:
            chosen = pubsub_verifier_from_settings(settings) or NotConfigured()
        return PubSubReceiver(
            verifier=chosen,
            ingest=ingest,
            quarantine=kept,
            max_bytes=settings.max_body_bytes,
            clock_ns=clock_ns,
            max_future_skew_s=settings.max_future_skew_s,
        )

    operations = OperationsRoutes(
        store=store,
        ingest=ingest,
        operations_auth=operations_auth,
        retry_right=retry_right if retry_right is not None else retry_by_setting(settings),
        max_bytes=settings.max_body_bytes,
        clock_ns=clock_ns,
        registrar=(
            OnFirstUse(registrar_factory)
            if registrar_factory is not None
            else OnFirstUse.ready(registrar)
        ),
        on_waiter=on_waiter,
        max_future_skew_s=settings.max_future_skew_s,
        retry_settings=settings,
    )
    app = Router()
    _add_routes(app, receiver, operations, OnFirstUse(pubsub_receiver))
    _add_error_answers(app)
    return app


def _log_quarantine() -> Keeper:
    from opstate.quarantine import LogQuarantine

    return LogQuarantine()


def _add_routes(
    app: Router,
    receiver: WebhookReceiver,
    operations: OperationsRoutes,
    pubsub: OnFirstUse[PubSubReceiver],
) -> None:
    app.route("POST", WEBHOOK_PATH, lambda request: receiver.answer(request.event))
    app.route("POST", PUBSUB_PATH, lambda request: pubsub.get().answer(request.event))
    app.route("GET", OPERATIONS_ROUTE, lambda request: operations.get(request.event, request.path))
    app.route("PUT", OPERATIONS_ROUTE, lambda request: operations.put(request.event, request.path))


def _add_error_answers(app: Router) -> None:
    def api_error(exc: ApiError, request: Request) -> Response:
        return json_response(exc.status, {"error": exc.code, "message": exc.message}, exc.headers)

    def not_found(request: Request) -> Response:
        return json_response(
            404,
            {
                "error": "not-found",
                "message": f"no route for {request.http_method} {request.path}",
            },
        )

    def internal_error(exc: Exception, request: Request) -> Response:
        logger.exception("unhandled error", extra={"error_type": type(exc).__name__})
        return json_response(500, {"error": "internal-error", "message": "internal error"})

    app.exception_handler(ApiError, api_error)
    app.not_found(not_found)
    app.exception_handler(Exception, internal_error)
