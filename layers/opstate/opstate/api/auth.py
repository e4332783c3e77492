"""Who may call the operations routes: ``require_iam_caller`` (Lambda), ``require_bearer_token``
(``opstate serve``) and ``lambda_operations_auth`` (the Lambda's choice, open under ``sam
local``); and who of them may also make opstate act, by attaching a retry policy
(docs/security.md, "Acting"): ``retry_by_setting`` (Lambda: ``OPSTATE_RETRY_OVER_API``) and
``retry_by_bearer`` (``opstate serve``: the holder of ``OPSTATE_RETRY_API_TOKEN``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opstate.api.errors import ApiError
from opstate.api.request import request_headers
from opstate.config import Settings
from opstate.observability import logger

# Decides whether an operations request may proceed: returns, or raises ``ApiError``.
OperationsAuth = Callable[[Mapping[str, Any]], None]
# Whether an admitted operations request may also attach a retry policy (create, upload and
# cancel at Gemini with the user's key): a separate right from reporting and tracking.
RetryRight = Callable[[Mapping[str, Any]], bool]


def require_iam_caller(event: Mapping[str, Any]) -> None:
    """403 unless the event carries ``requestContext.authorizer.iam``, which API Gateway adds
    only on routes with the AWS_IAM authorizer, after checking the caller's SigV4 signature."""
    context = event.get("requestContext")
    authorizer = context.get("authorizer") if isinstance(context, Mapping) else None
    iam = authorizer.get("iam") if isinstance(authorizer, Mapping) else None
    if not isinstance(iam, Mapping) or not iam:
        raise ApiError(403, "forbidden", "this route requires AWS IAM (SigV4) authorization")


def require_bearer_token(token: str, retry_token: str | None = None) -> OperationsAuth:
    """401 unless the request carries ``Authorization: Bearer <token>`` (constant-time check),
    or the retry token (``OPSTATE_RETRY_API_TOKEN``), whose holder may report and track too."""
    from opstate.api_token import bearer_token_ok

    if not token:
        raise ValueError("the API token may not be empty")

    def check(event: Mapping[str, Any]) -> None:
        presented = request_headers(event).get("authorization")
        ok = bearer_token_ok(presented, token)
        also = bearer_token_ok(presented, retry_token) if retry_token else False
        if not (ok or also):
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


def retry_by_setting(config: Settings) -> RetryRight:
    """The Lambda's retry right: every caller IAM admitted, once the operator set
    ``OPSTATE_RETRY_OVER_API`` (template parameter ``RetryOverApi``); else no one."""
    allowed = config.retry_over_api

    def check(event: Mapping[str, Any]) -> bool:
        return allowed

    return check


def retry_by_bearer(retry_token: str | None) -> RetryRight:
    """``opstate serve``'s retry right: the request's bearer token is ``retry_token``
    (constant-time check); None: no one (the API token alone never grants it)."""
    from opstate.api_token import bearer_token_ok

    def check(event: Mapping[str, Any]) -> bool:
        if not retry_token:
            return False
        return bearer_token_ok(request_headers(event).get("authorization"), retry_token)

    return check
