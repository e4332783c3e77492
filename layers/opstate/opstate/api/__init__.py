"""The HTTP API: Gemini webhooks in, operation records out (API Gateway HTTP API payload v2).

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

The package owns the API: ``router`` (routing HTTP API payload 2.0 events, ``Response``),
``lazy`` (parts built by their first request), ``errors`` (``ApiError``, JSON responses, the 503
of an unavailable dependency), ``request`` (body, size limit, JSON, headers), ``auth`` (who may
call the operations routes), ``ingesting`` (one event into the store, with the API's answers to
its failures), ``webhook`` (the webhook receiver and its quarantine), ``pubsub`` (Pub/Sub
pushes, imported by the first one), ``operations`` (the operations routes), ``app``
(``create_app``: the wiring) and ``lambda_entry`` (``handle``, ``default_app``); every name
callers use is re-exported here. The Lambda's init imports only what every webhook or
operations request needs (docs/api.md, "Cold start"). It may import the domain,
settings (``opstate.config``), ingest, the store, signatures, the quarantine, observability,
``opstate.api_token``, the waiters and the results view (``opstate.outcomes.results``), never
the notifier, the reconciler, the local server or the CLI.
"""

from opstate.api.app import create_app
from opstate.api.auth import (
    OperationsAuth,
    RetryRight,
    lambda_operations_auth,
    require_bearer_token,
    require_iam_caller,
    retry_by_bearer,
    retry_by_setting,
)
from opstate.api.errors import (
    JSON,
    RETRY_AFTER_CONTENTION_S,
    RETRY_AFTER_UNAVAILABLE_S,
    ApiError,
    json_response,
)
from opstate.api.lambda_entry import default_app, handle, reset_default_app
from opstate.api.operations import OPERATIONS_ROUTE
from opstate.api.request import MAX_LOGGED_ID, parse_json, raw_body

__all__ = [
    "JSON",
    "MAX_LOGGED_ID",
    "OPERATIONS_ROUTE",
    "RETRY_AFTER_CONTENTION_S",
    "RETRY_AFTER_UNAVAILABLE_S",
    "ApiError",
    "OperationsAuth",
    "RetryRight",
    "create_app",
    "default_app",
    "handle",
    "json_response",
    "lambda_operations_auth",
    "parse_json",
    "raw_body",
    "require_bearer_token",
    "require_iam_caller",
    "reset_default_app",
    "retry_by_bearer",
    "retry_by_setting",
]
