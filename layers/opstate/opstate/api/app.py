"""``create_app``: the routes wired onto one Powertools resolver, with the JSON error answers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError

from opstate.api.auth import OperationsAuth, require_iam_caller
from opstate.api.errors import ApiError, json_response
from opstate.api.ingesting import Ingester
from opstate.api.operations import OPERATIONS_ROUTE, OperationsRoutes
from opstate.api.webhook import WebhookReceiver
from opstate.config import Settings
from opstate.model import Decision
from opstate.observability import logger
from opstate.quarantine import LogQuarantine, Quarantine
from opstate.routes import WEBHOOK_PATH
from opstate.signatures import Verifier
from opstate.store.port import Store

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

# Powertools keeps the current event on the router class, shared by every resolver instance:
# resolve() is serialised so a threaded local server cannot mix two requests up.
_RESOLVE_LOCK = threading.Lock()


class _Resolver(APIGatewayHttpResolver):
    def resolve(self, event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
        with _RESOLVE_LOCK:
            return super().resolve(event, context)


def create_app(
    *,
    store: Store,
    verifier: Verifier,
    settings: Settings,
    clock_ns: Callable[[], int] = time.time_ns,
    on_decision: Callable[[Decision], None] | None = None,
    quarantine: Quarantine | None = None,
    operations_auth: OperationsAuth = require_iam_caller,
) -> APIGatewayHttpResolver:
    """The API's resolver over ``store``; ``on_decision`` sees every decision taken;
    ``operations_auth`` admits or refuses each operations request (default: AWS IAM); signed
    webhooks that cannot be read are kept in ``quarantine`` (default: logged whole)."""
    app = _Resolver()
    ingest = Ingester(store, settings.ingest_max_attempts, clock_ns, on_decision)
    receiver = WebhookReceiver(
        verifier=verifier,
        ingest=ingest,
        quarantine=quarantine if quarantine is not None else LogQuarantine(),
        max_bytes=settings.max_body_bytes,
        clock_ns=clock_ns,
        max_future_skew_s=settings.max_future_skew_s,
    )
    operations = OperationsRoutes(
        store=store,
        ingest=ingest,
        operations_auth=operations_auth,
        max_bytes=settings.max_body_bytes,
        clock_ns=clock_ns,
        max_future_skew_s=settings.max_future_skew_s,
    )
    _add_routes(app, receiver, operations)
    _add_error_answers(app)
    return app


def _add_routes(
    app: APIGatewayHttpResolver, receiver: WebhookReceiver, operations: OperationsRoutes
) -> None:
    @app.post(WEBHOOK_PATH)
    def webhook() -> Response[str]:
        return receiver.answer(app.current_event.raw_event)

    @app.get(OPERATIONS_ROUTE)
    def get_operation() -> Response[str]:
        event = app.current_event
        return operations.get(event.raw_event, event.path)

    @app.put(OPERATIONS_ROUTE)
    def put_operation() -> Response[str]:
        event = app.current_event
        return operations.put(event.raw_event, event.path)


def _add_error_answers(app: APIGatewayHttpResolver) -> None:
    @app.exception_handler(ApiError)  # type: ignore[untyped-decorator]
    def api_error(exc: ApiError) -> Response[str]:
        return json_response(exc.status, {"error": exc.code, "message": exc.message}, exc.headers)

    @app.not_found
    def not_found(exc: NotFoundError) -> Response[str]:
        event = app.current_event
        return json_response(
            404,
            {"error": "not-found", "message": f"no route for {event.http_method} {event.path}"},
        )

    @app.exception_handler(Exception)  # type: ignore[untyped-decorator]
    def internal_error(exc: Exception) -> Response[str]:
        logger.exception("unhandled error", extra={"error_type": type(exc).__name__})
        return json_response(500, {"error": "internal-error", "message": "internal error"})
