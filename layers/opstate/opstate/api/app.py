"""``create_app``: the routes wired onto one Powertools resolver, with the JSON error answers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.api_gateway import ResponseBuilder
from aws_lambda_powertools.event_handler.exceptions import NotFoundError

from opstate.api.auth import OperationsAuth, require_iam_caller
from opstate.api.errors import ApiError, json_response
from opstate.api.ingesting import Ingester
from opstate.api.operations import OPERATIONS_ROUTE, OperationsRoutes
from opstate.api.pubsub import NotConfigured, PubSubReceiver
from opstate.api.webhook import WebhookReceiver
from opstate.config import Settings
from opstate.domain.model import Decision
from opstate.domain.routes import PUBSUB_PATH, WEBHOOK_PATH
from opstate.observability import logger
from opstate.quarantine import LogQuarantine, Quarantine
from opstate.signatures import Verifier, pubsub_verifier_from_settings
from opstate.store.port import Store
from opstate.waiters.run import Registrar

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2
    from aws_lambda_powertools.utilities.typing import LambdaContext


class _ResponseBuilder(ResponseBuilder[Any]):
    """Powertools' response builder, which reads the request's headers for ``Accept-Encoding``
    only when the route or the response may be compressed (none of ours is): Powertools builds
    a case-insensitive copy of every header, each split at its commas, on every response to
    answer that question, whose answer is then no compression whatever the header says."""

    @staticmethod
    def _has_compression_enabled(
        route_compression: bool, response_compression: bool | None, event: Any
    ) -> bool:
        if not route_compression and not response_compression:
            return False
        return ResponseBuilder._has_compression_enabled(
            route_compression, response_compression, event
        )


class _Resolver(APIGatewayHttpResolver):
    """Powertools' HTTP API resolver, its per-request state kept per thread.

    Powertools keeps the request being resolved on the router *class* (``BaseRouter.
    current_event`` and ``lambda_context``, shared by every resolver) and its routing context on
    the instance, so two threads resolving at once would read each other's request. Here the
    three live in a ``threading.local`` and ``resolve`` does what Powertools' does (no debug
    print, which is off) with them: ``opstate serve``'s worker threads resolve requests in
    parallel, with no process-wide lock, so a read never waits behind a write that waits on
    the store (tests/integration/test_serve_parallel.py). In Lambda one request at a time is
    resolved, as before.
    """

    def __init__(self) -> None:
        self._request = threading.local()
        super().__init__()
        self._response_builder_class = _ResponseBuilder

    @property  # type: ignore[override]
    def current_event(self) -> APIGatewayProxyEventV2:
        event: APIGatewayProxyEventV2 = self._request.event
        return event

    @current_event.setter
    def current_event(self, value: APIGatewayProxyEventV2) -> None:
        self._request.event = value

    @property
    def lambda_context(self) -> LambdaContext:
        context: LambdaContext = self._request.lambda_context
        return context

    @lambda_context.setter
    def lambda_context(self, value: LambdaContext) -> None:
        self._request.lambda_context = value

    @property
    def context(self) -> dict[str, Any]:
        request = self._request
        if not hasattr(request, "context"):
            request.context = {}
        routing: dict[str, Any] = request.context
        return routing

    @context.setter
    def context(self, value: dict[str, Any]) -> None:
        self._request.context = value

    def build_middleware_stacks(self) -> None:
        """Build every route's middleware stack now, once. Powertools builds a route's stack
        lazily on its first request and flags it built; two threads taking a route's first
        request at once would both build it, one calling the other's half-built stack
        (``TypeError: MiddlewareFrame.__call__() missing ... 'app'``). Built here, before any
        request, it is only read afterwards."""
        for route in self._static_routes + self._dynamic_routes:
            if not route._middleware_stack_built:
                route._build_middleware_stack(router_middlewares=self._router_middlewares, app=self)

    def resolve(self, event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
        self.current_event = cast("APIGatewayProxyEventV2", self._to_proxy_event(dict(event)))
        self.lambda_context = context
        try:
            return self._build_response(self._resolve())
        finally:
            self.context.clear()


def create_app(
    *,
    store: Store,
    verifier: Verifier,
    settings: Settings,
    clock_ns: Callable[[], int] = time.time_ns,
    on_decision: Callable[[Decision], None] | None = None,
    quarantine: Quarantine | None = None,
    operations_auth: OperationsAuth = require_iam_caller,
    pubsub_verifier: Verifier | None = None,
    registrar: Registrar | None = None,
    on_waiter: Callable[[str], None] | None = None,
) -> APIGatewayHttpResolver:
    """The API's resolver over ``store``; ``on_decision`` sees every decision taken;
    ``operations_auth`` admits or refuses each operations request (default: AWS IAM); signed
    webhooks that cannot be read are kept in ``quarantine`` (default: logged whole); Pub/Sub
    pushes meet ``pubsub_verifier`` (default: the one the settings describe, else refused)."""
    app = _Resolver()
    ingest = Ingester(store, settings.ingest_max_attempts, clock_ns, on_decision)
    kept = quarantine if quarantine is not None else LogQuarantine()
    receiver = WebhookReceiver(
        verifier=verifier,
        ingest=ingest,
        quarantine=kept,
        max_bytes=settings.max_body_bytes,
        clock_ns=clock_ns,
    )
    if pubsub_verifier is None:
        pubsub_verifier = pubsub_verifier_from_settings(settings) or NotConfigured()
    pubsub = PubSubReceiver(
        verifier=pubsub_verifier,
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
        max_bytes=settings.max_body_bytes,
        clock_ns=clock_ns,
        registrar=registrar,
        on_waiter=on_waiter,
        max_future_skew_s=settings.max_future_skew_s,
    )
    _add_routes(app, receiver, operations, pubsub)
    _add_error_answers(app)
    app.build_middleware_stacks()
    return app


def _add_routes(
    app: APIGatewayHttpResolver,
    receiver: WebhookReceiver,
    operations: OperationsRoutes,
    pubsub: PubSubReceiver,
) -> None:
    @app.post(WEBHOOK_PATH)
    def webhook() -> Response[str]:
        return receiver.answer(app.current_event.raw_event)

    @app.post(PUBSUB_PATH)
    def pubsub_push() -> Response[str]:
        return pubsub.answer(app.current_event.raw_event)

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
