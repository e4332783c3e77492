"""The Lambda entry: ``handle`` routes one event through the app built once by ``default_app``
(settings, the configured store, verifier, quarantine and the IAM rule)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from opstate.api.app import create_app
from opstate.api.auth import lambda_operations_auth
from opstate.api.webhook import Keeper, QuarantineOnFirstUse
from opstate.config import Settings, settings

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from opstate.api.router import Router
    from opstate.store.port import Store
    from opstate.waiters.run import Registrar

_app: Router | None = None
_app_lock = threading.Lock()


@contextmanager
def _built_for_life() -> Iterator[None]:
    """Build objects that live as long as the process with the cyclic GC paused, then freeze
    them out of its reach (``gc.freeze``). Building the app imports boto3 and loads botocore's
    service model: a full collection set off by those allocations would find nothing to free
    and cost about a tenth of the cold start (benchmarks/bench_cold.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if enabled:
            gc.enable()


def _quarantine(config: Settings) -> Keeper:
    """The quarantine the settings name (``OPSTATE_QUARANTINE_QUEUE_URL``, else the log)."""
    from opstate.quarantine import quarantine_from_settings

    return quarantine_from_settings(config.quarantine_queue_url)


def _registrar_factory(store: Store, config: Settings) -> Callable[[], Registrar | None]:
    """The waiters' registrar beside ``store``, built by the first report that names a waiter
    (the waiters code and its DynamoDB client are no part of the init)."""

    def build() -> Registrar | None:
        from opstate.waiters.wiring import registrar_for, waiter_store_for

        return registrar_for(waiter_store_for(store, config), config)

    return build


def default_app() -> Router:
    """The app the Lambda serves, built once from ``settings()``: the store named by
    ``OPSTATE_STORE`` / ``OPSTATE_TABLE_NAME``, the configured webhook verifier and the waiters
    beside the store (``OPSTATE_WAITERS_TABLE_NAME`` for DynamoDB; built on first use)."""
    global _app
    with _app_lock:
        if _app is None:
            from opstate.signatures import verifier_from_settings
            from opstate.store import store_from_url

            with _built_for_life():
                config = settings()
                store = store_from_url(config.store_url, config)
                _app = create_app(
                    store=store,
                    verifier=verifier_from_settings(config),
                    settings=config,
                    operations_auth=lambda_operations_auth(config),
                    quarantine=QuarantineOnFirstUse(partial(_quarantine, config)),
                    # Registration only: the resumer function resumes (the waiters stream).
                    registrar_factory=_registrar_factory(store, config),
                )
        return _app


def reset_default_app() -> None:
    """Forget the cached app (tests; a changed environment)."""
    global _app
    with _app_lock:
        _app = None


PAYLOAD_V1_MESSAGE = (
    "this function serves an API Gateway HTTP API with payload format 2.0; the event is not "
    "one (a REST API or payload 1.0 integration): make the integration an HTTP API "
    "(payload 2.0)"
)


def is_http_api_v2(event: object) -> bool:
    """Whether ``event`` is an API Gateway HTTP API payload 2.0 event (``requestContext.http``)."""
    if not isinstance(event, Mapping):
        return False
    context = event.get("requestContext")
    return isinstance(context, Mapping) and isinstance(context.get("http"), Mapping)


def handle(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The Lambda entry: route one API Gateway HTTP API (payload v2) event. Any other event (a
    REST API's payload 1.0) is answered a JSON 400 naming the fix, never a 502."""
    if not is_http_api_v2(event):
        from opstate.domain.strict_json import dumps
        from opstate.observability import logger

        logger.error("not an HTTP API payload 2.0 event", extra={"error": "unsupported-payload"})
        return {
            "statusCode": 400,
            "headers": {"Content-Type": "application/json"},
            "body": dumps(
                {"error": "unsupported-payload", "message": PAYLOAD_V1_MESSAGE}, compact=True
            ),
            "isBase64Encoded": False,
        }
    return default_app().resolve(event, context)
