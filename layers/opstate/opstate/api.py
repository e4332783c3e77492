"""The HTTP API: Gemini webhooks in, operation records out (Powertools, HTTP API payload v2).

Routes:
- ``POST /gemini/webhook``: size check (413, before any HMAC work), signature verification over
  the raw (base64-decoded) body (401), then JSON -> ``from_webhook`` -> ``ingest``.
- ``GET /operations/{name+}``: the record (``views.record_to_json``) or 404.
- ``PUT /operations/{name+}``: a report from the user's own producer; no body = "track this
  job" (PENDING now).

Who may call the operations routes is decided by ``operations_auth`` before anything else: in
Lambda, ``require_iam_caller`` (403 unless API Gateway's AWS_IAM authorizer vouched for the
caller, so a route deployed without it cannot open the table); in ``opstate serve``,
``require_bearer_token`` (401 without ``Authorization: Bearer <token>``).

Response contract (JSON): 200 ``{applied, reason, name, state, version}`` when the event was
applied or deliberately dropped; 400 ``{error, message}`` for malformed input (nothing
written), never for a webhook that passed the signature check: one we cannot read is kept in
the quarantine and answered 200 ``reason: quarantined`` (``opstate.quarantine``); 401
``invalid-signature``; 413 ``payload-too-large``; 503 with ``Retry-After`` when
the event was neither applied nor dropped (contention, store or secrets unavailable) - never
200 then; 404 ``not-found`` for unknown records and routes.
"""

from __future__ import annotations

import base64
import binascii
import gc
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError

from opstate.config import Settings, settings
from opstate.events import (
    InvalidEventError,
    OpEvent,
    UnsupportedEventError,
    from_report,
    from_webhook,
)
from opstate.ingest import IngestContentionError, find_record, ingest
from opstate.names import (
    VIDEO_DETAIL,
    InvalidNameError,
    Kind,
    ParsedName,
    canonical_name,
    parse_name,
)
from opstate.observability import (
    count,
    logger,
    record_decision,
    record_retry_later,
    record_signature_rejected,
    record_unsupported,
    record_webhook_outcome,
)
from opstate.quarantine import Delivery, LogQuarantine, Quarantine
from opstate.reducer import Decision
from opstate.signatures import SignatureError, Verifier
from opstate.store.port import RetryableError, Store
from opstate.strict_json import InvalidJSONError, dumps, loads
from opstate.views import decision_to_json, record_to_json

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

JSON = "application/json"
WEBHOOK_PATH = "/gemini/webhook"
OPERATIONS_PREFIX = "/operations/"
# Powertools treats a route rule as a regular expression: ".+" is its documented catch-all,
# here a greedy, slash-containing operation name.
OPERATIONS_ROUTE = OPERATIONS_PREFIX + ".+"
RETRY_AFTER_CONTENTION_S = 1
RETRY_AFTER_UNAVAILABLE_S = 5
MAX_LOGGED_ID = 128

# Decides whether an operations request may proceed: returns, or raises ``ApiError``.
OperationsAuth = Callable[[Mapping[str, Any]], None]

# Powertools keeps the current event on the router class, shared by every resolver instance:
# resolve() is serialised so a threaded local server cannot mix two requests up.
_RESOLVE_LOCK = threading.Lock()


class ApiError(Exception):
    """A JSON error response: ``{"error": code, "message": message}``."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def json_response(
    status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Response[str]:
    return Response(
        status_code=status,
        content_type=JSON,
        body=dumps(body, compact=True),
        headers=dict(headers or {}),
    )


def parse_json(raw: bytes) -> Any:
    """JSON from raw bytes by the one rule (``strict_json``), or a 400 ``malformed-json``."""
    try:
        return loads(raw)
    except InvalidJSONError:
        raise ApiError(400, "malformed-json", "the body is not valid JSON") from None


def raw_body(event: Mapping[str, Any], max_bytes: int) -> bytes:
    """The request body as the sender's bytes; 413 when over ``max_bytes``, decided on the
    encoded length before decoding where possible, and always before any signature work."""
    body = event.get("body")
    if body is None or body == "":
        return b""
    if not isinstance(body, str):
        raise ApiError(400, "invalid-body", "the request body is not text")
    too_large = ApiError(413, "payload-too-large", f"the body is larger than {max_bytes} bytes")
    if event.get("isBase64Encoded"):
        # n base64 characters decode to at most 3n/4 bytes.
        if (len(body) // 4) * 3 > max_bytes + 3:
            raise too_large
        try:
            raw = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "invalid-body", "the body is not valid base64") from None
    else:
        if len(body) > max_bytes:  # every character is at least one byte
            raise too_large
        raw = body.encode("utf-8", "surrogatepass")
    if len(raw) > max_bytes:
        raise too_large
    return raw


def _headers(event: Mapping[str, Any]) -> dict[str, str]:
    headers = event.get("headers") or {}
    if not isinstance(headers, Mapping):
        return {}
    return {str(k).lower(): v for k, v in headers.items() if isinstance(v, str)}


def _best_effort_name(body: object) -> str | None:
    """The canonical name an unsupported webhook refers to, if one can be read (logging)."""
    if not isinstance(body, Mapping):
        return None
    data = body.get("data")
    if not isinstance(data, Mapping):
        return None
    raw = data.get("id") or data.get("name")
    event_type = body.get("type")
    family = event_type.split(".", 1)[0] if isinstance(event_type, str) else ""
    hint = {"batch": Kind.BATCH, "interaction": Kind.INTERACTION, "video": Kind.VIDEO}.get(family)
    try:
        return canonical_name(raw, hint)
    except InvalidNameError:
        return None


def _clip(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= MAX_LOGGED_ID else text[: MAX_LOGGED_ID - 3] + "..."


def require_iam_caller(event: Mapping[str, Any]) -> None:
    """403 unless the event carries ``requestContext.authorizer.iam``, which API Gateway adds
    only on routes with the AWS_IAM authorizer, after checking the caller's SigV4 signature."""
    context = event.get("requestContext")
    authorizer = context.get("authorizer") if isinstance(context, Mapping) else None
    iam = authorizer.get("iam") if isinstance(authorizer, Mapping) else None
    if not isinstance(iam, Mapping) or not iam:
        raise ApiError(403, "forbidden", "this route requires AWS IAM (SigV4) authorization")


def require_bearer_token(token: str) -> OperationsAuth:
    """401 unless the request carries ``Authorization: Bearer <token>`` (constant-time check)."""
    from opstate.api_token import bearer_token_ok

    if not token:
        raise ValueError("the API token may not be empty")

    def check(event: Mapping[str, Any]) -> None:
        if not bearer_token_ok(_headers(event).get("authorization"), token):
            raise ApiError(
                401,
                "unauthorized",
                "this route requires 'Authorization: Bearer <token>' (the opstate API token)",
                {"WWW-Authenticate": 'Bearer realm="opstate"'},
            )

    return check


def _sam_local_open(event: Mapping[str, Any]) -> None:
    """``sam local`` (``AWS_SAM_LOCAL=true``): SAM does not emulate AWS_IAM, so no check."""


def lambda_operations_auth(config: Settings) -> OperationsAuth:
    """The Lambda's rule: ``require_iam_caller``, except under ``sam local``, whose API emulator
    has no AWS_IAM authorizer and never adds its context (``AWS_SAM_LOCAL`` is set by SAM CLI
    inside its containers; a deployment never sets it)."""
    if config.sam_local:
        logger.warning("AWS_SAM_LOCAL=true: the operations routes are not IAM-checked")
        return _sam_local_open
    return require_iam_caller


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
    max_bytes = settings.max_body_bytes
    kept_in: Quarantine = quarantine if quarantine is not None else LogQuarantine()

    def keep(
        raw: bytes, code: str, message: str, body: object, webhook_id: str | None
    ) -> Response[str]:
        """A signed delivery we cannot read: kept, answered 200 (never a 4xx: Gemini would
        retry it for a day, then disable the endpoint), counted; 503 if it cannot be kept."""
        delivery = Delivery.new(
            raw, webhook_id=webhook_id, reason=code, message=message, received_ns=clock_ns()
        )
        try:
            kept_in.put(delivery)
        except RetryableError as exc:
            raise _unavailable(exc, webhook_id=webhook_id) from None
        name = _best_effort_name(body)
        logger.warning(
            "webhook quarantined",
            extra={
                "reason": "quarantined",
                "error": code,
                "detail": message[:300],
                "operation": name,
                "webhook_id": webhook_id,
                "quarantine_id": delivery.id,
            },
        )
        count("WebhooksQuarantined")
        return json_response(
            200,
            {
                "applied": False,
                "reason": "quarantined",
                "name": name,
                "state": None,
                "version": 0,
                "error": code,
                "quarantineId": delivery.id,
            },
        )

    def run_ingest(event: OpEvent, **context: object) -> Decision:
        try:
            decision = ingest(
                store, event, max_attempts=settings.ingest_max_attempts, clock_ns=clock_ns
            )
        except IngestContentionError as exc:
            record_retry_later("gave-up", str(exc), name=event.name, **context)
            raise ApiError(
                503,
                "retry-later",
                "too many concurrent updates to this operation; retry later",
                {"Retry-After": str(RETRY_AFTER_CONTENTION_S)},
            ) from None
        except RetryableError as exc:
            raise _unavailable(exc, name=event.name, **context) from None
        record_decision(decision, **context)
        if on_decision is not None:
            try:
                on_decision(decision)
            except Exception:
                logger.exception("on_decision callback failed", extra={"operation": event.name})
        return decision

    @app.post(WEBHOOK_PATH)
    def webhook() -> Response[str]:
        try:
            response, outcome = receive_webhook()
        except ApiError as exc:
            record_webhook_outcome(_error_outcome(exc.status))
            raise
        except Exception:
            record_webhook_outcome("error")
            raise
        record_webhook_outcome(outcome)
        return response

    def receive_webhook() -> tuple[Response[str], str]:
        """The answer to one webhook request and its ``WebhookDeliveries`` outcome."""
        event = app.current_event.raw_event
        raw = raw_body(event, max_bytes)
        headers = _headers(event)
        webhook_id = _clip(headers.get("webhook-id"))
        try:
            verifier.verify(raw, headers)
        except SignatureError:
            record_signature_rejected(webhook_id=webhook_id)
            raise ApiError(401, "invalid-signature", "invalid signature") from None
        except RetryableError as exc:
            raise _unavailable(exc, webhook_id=webhook_id) from None
        try:
            body = parse_json(raw)
        except ApiError as exc:
            return keep(raw, exc.code, exc.message, None, webhook_id), "quarantined"
        try:
            op_event = from_webhook(body)
        except InvalidEventError as exc:
            return keep(raw, exc.code, exc.message, body, webhook_id), "quarantined"
        except UnsupportedEventError as exc:
            name = _best_effort_name(body)
            event_type = body.get("type") if isinstance(body, Mapping) else None
            record_unsupported(
                exc.reason,
                exc.message,
                name=name,
                event_type=event_type if isinstance(event_type, str) else None,
                source="webhook",
                webhook_id=webhook_id,
            )
            return json_response(
                200,
                {"applied": False, "reason": exc.reason, "name": name, "state": None, "version": 0},
            ), "dropped"
        decision = run_ingest(op_event, webhook_id=webhook_id)
        outcome = "applied" if decision.applied else "dropped"
        return json_response(200, decision_to_json(decision)), outcome

    @app.get(OPERATIONS_ROUTE)
    def get_operation() -> Response[str]:
        operations_auth(app.current_event.raw_event)
        parsed = _path_parsed(app.current_event.path)
        name = parsed.key
        try:
            # A video operation tracked before its key dropped the model is still found.
            record = find_record(
                store, name, {VIDEO_DETAIL: parsed.model} if parsed.model else None
            )
        except RetryableError as exc:
            raise _unavailable(exc, name=name) from None
        if record is None:
            raise ApiError(404, "not-found", f"no operation named {name!r} is tracked")
        return json_response(200, record_to_json(record))

    @app.put(OPERATIONS_ROUTE)
    def put_operation() -> Response[str]:
        operations_auth(app.current_event.raw_event)
        raw_name = _raw_path_name(app.current_event.path)
        raw = raw_body(app.current_event.raw_event, max_bytes)
        body = None if not raw.strip() else parse_json(raw)
        if body is not None and not isinstance(body, Mapping):
            raise ApiError(400, "invalid-body", "the report body must be a JSON object")
        try:
            op_event = from_report(raw_name, body, now_ns=clock_ns())
        except InvalidEventError as exc:
            raise ApiError(400, exc.code, exc.message) from None
        except UnsupportedEventError as exc:
            # The producer is the user's own code: an unknown state is its bug to fix.
            raise ApiError(400, "invalid-state", exc.message) from None
        decision = run_ingest(op_event)
        return json_response(200, decision_to_json(decision))

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

    return app


def _error_outcome(status: int) -> str:
    """The ``WebhookDeliveries`` outcome of a webhook answered with an error ``status``."""
    if status == 401:
        return "rejected"
    if status == 503:
        return "retry-later"
    return "invalid" if 400 <= status < 500 else "error"


def _unavailable(exc: BaseException, **context: object) -> ApiError:
    record_retry_later("unavailable", str(exc), **context)
    return ApiError(
        503,
        "unavailable",
        "a dependency is unavailable; retry later",
        {"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)},
    )


def _raw_path_name(path: str) -> str:
    return unquote(path[len(OPERATIONS_PREFIX) :])


def _path_parsed(path: str) -> ParsedName:
    try:
        return parse_name(_raw_path_name(path))
    except InvalidNameError as exc:
        raise ApiError(400, "invalid-name", str(exc)) from None


# --- Lambda entry --------------------------------------------------------------------------------

_app: APIGatewayHttpResolver | None = None
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


def default_app() -> APIGatewayHttpResolver:
    """The app the Lambda serves, built once from ``settings()``: the store named by
    ``OPSTATE_STORE`` / ``OPSTATE_TABLE_NAME`` and the configured webhook verifier."""
    global _app
    with _app_lock:
        if _app is None:
            from opstate.quarantine import quarantine_from_settings
            from opstate.signatures import verifier_from_settings
            from opstate.store import store_from_url

            with _built_for_life():
                config = settings()
                _app = create_app(
                    store=store_from_url(config.store_url, config),
                    verifier=verifier_from_settings(config),
                    settings=config,
                    operations_auth=lambda_operations_auth(config),
                    quarantine=quarantine_from_settings(config.quarantine_queue_url),
                )
        return _app


def reset_default_app() -> None:
    """Forget the cached app (tests; a changed environment)."""
    global _app
    with _app_lock:
        _app = None


def handle(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The Lambda entry: route one API Gateway HTTP API (payload v2) event."""
    return default_app().resolve(event, context)
