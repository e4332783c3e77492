"""The API's answers: ``ApiError`` (a JSON error response), ``json_response`` and the 503 of an
unavailable dependency."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.api.router import Response
from opstate.domain.strict_json import dumps
from opstate.observability import record_retry_later

JSON = "application/json"
RETRY_AFTER_CONTENTION_S = 1
RETRY_AFTER_UNAVAILABLE_S = 5


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
) -> Response:
    return Response(
        status_code=status,
        content_type=JSON,
        body=dumps(body, compact=True),
        headers=dict(headers or {}),
    )


def unavailable(exc: BaseException, **context: object) -> ApiError:
    """The 503 (``Retry-After``) for a store, quarantine or secrets source that failed; logged
    and counted as a retry-later with ``context``."""
    record_retry_later("unavailable", str(exc), **context)
    return ApiError(
        503,
        "unavailable",
        "a dependency is unavailable; retry later",
        {"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)},
    )
