"""The API's router for API Gateway HTTP API (payload format 2.0) events: what ``opstate.api``
used of Powertools' ``APIGatewayHttpResolver``, written out.

Importing Powertools' ``event_handler`` package cost the webhook's cold start about 26 ms of
import time (its ``__init__`` loads the AppSync resolvers and with them ``asyncio``, 33 modules
of event data classes and the OpenAPI models), an eighth of a bare boto3 client's, for the API's
four routes (docs/api.md, "Cold start"). The rules are Powertools', kept so every answer is the
same:

- a route is an HTTP method and a regular expression matched against the whole path (``^rule$``),
  the path being ``rawPath`` less ``/{stage}`` unless the stage is ``$default``; the first route
  registered that matches the method (upper-cased) and the path answers;
- no route: the ``not_found`` handler answers (an unknown path, and a known path with another
  method, alike: 404, never a 405); no CORS (no route enables it);
- an exception a handler raises goes to the handler registered for the nearest class in its MRO,
  else it propagates; one an exception handler raises propagates;
- the response: ``{statusCode, body, isBase64Encoded: false, headers, cookies: []}`` with the
  body as the handler's text and ``Content-Type`` added to the headers unless they name it.

A router holds no per-request state: any number of threads resolve with one router at once
(``opstate serve``'s worker threads), each request its own ``Request``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


class Response:
    """One answer: status, body text and headers (``content_type`` is ``Content-Type`` unless
    ``headers`` names it)."""

    __slots__ = ("body", "headers", "status_code")

    def __init__(
        self,
        status_code: int,
        content_type: str | None = None,
        body: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.status_code = status_code
        self.body = body
        self.headers: dict[str, str] = dict(headers) if headers else {}
        if content_type:
            self.headers.setdefault("Content-Type", content_type)

    def to_event(self) -> dict[str, Any]:
        """The HTTP API payload 2.0 response."""
        return {
            "statusCode": self.status_code,
            "body": self.body,
            "isBase64Encoded": False,
            "headers": dict(self.headers),
            "cookies": [],
        }


class Request:
    """One request being routed: the event as received, its method and its path (the stage
    removed)."""

    __slots__ = ("event", "http_method", "path")

    def __init__(self, event: Mapping[str, Any]) -> None:
        self.event = event
        context = event["requestContext"]
        self.http_method: str = context["http"]["method"]
        raw_path: str = event["rawPath"]
        stage = context.get("stage", "$default")
        self.path = raw_path if stage == "$default" else raw_path[len(f"/{stage}") :]


Handler = Callable[[Request], Response]
ErrorHandler = Callable[[Any, Request], Response]


class Router:
    """Routes HTTP API payload 2.0 events to handlers (see the module docstring)."""

    __slots__ = ("_errors", "_not_found", "_routes")

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self._errors: dict[type[BaseException], ErrorHandler] = {}
        self._not_found: Handler = _default_not_found

    def route(self, method: str, rule: str, handler: Handler) -> None:
        """Answer ``method`` requests whose whole path matches the regular expression ``rule``."""
        self._routes.append((method.upper(), re.compile(f"^{rule}$"), handler))

    def not_found(self, handler: Handler) -> None:
        """Answer requests no route matches with ``handler``."""
        self._not_found = handler

    def exception_handler[E: Exception](
        self, exc_class: type[E], handler: Callable[[E, Request], Response]
    ) -> None:
        """Answer an ``exc_class`` raised by a handler (or a subclass with no handler of its
        own) with ``handler``."""
        self._errors[exc_class] = handler

    def resolve(self, event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
        """The response to one event (``context``, the Lambda context, is not read: typed as
        Powertools' resolver typed it)."""
        request = Request(event)
        handler = self._match(request.http_method.upper(), request.path)
        try:
            response = handler(request)
        except Exception as exc:
            on_error = self._error_handler(type(exc))
            if on_error is None:
                raise
            response = on_error(exc, request)
        return response.to_event()

    def _match(self, method: str, path: str) -> Handler:
        for route_method, rule, handler in self._routes:
            if route_method == method and rule.match(path):
                return handler
        return self._not_found

    def _error_handler(self, exc_type: type[BaseException]) -> ErrorHandler | None:
        for cls in exc_type.__mro__:
            handler = self._errors.get(cls)
            if handler is not None:
                return handler
        return None


def _default_not_found(request: Request) -> Response:
    return Response(404, "application/json", '{"statusCode":404,"message":"Not found"}')
