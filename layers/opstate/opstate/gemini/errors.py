"""A failed request to Gemini (or Google Cloud through google-genai) as one ``GatewayError``.

``classify`` turns an SDK or transport exception into it: the HTTP status, whether the same
request may succeed later (408, 429, 5xx, timeouts, connection errors), the server's
``Retry-After`` (seconds or an HTTP date), what the server said, for a person to read, and its
``google.rpc.Status`` ``details`` as ``opstate.domain.refusals.sanitize_details`` keeps them
(QuotaFailure, RetryInfo, ErrorInfo; bounded), which say what a refusal means for a retry. It
imports ``google.genai`` inside the function only, so importing this module loads no SDK.
"""

from __future__ import annotations

import importlib
from email.utils import parsedate_to_datetime
from typing import Any

from opstate.domain.refusals import sanitize_details

# HTTP statuses after which the same request may succeed later.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class GatewayError(Exception):
    """A request failed. ``status`` is the HTTP status (None: no answer, e.g. a timeout);
    ``transient``: the same request may succeed later; ``retry_after_s``: the server's
    ``Retry-After``, when it sent one; ``said``: what the server said, for a person to read
    (``sentence`` falls back to ``message``, the technical text that is logged); ``rpc_status``
    and ``details``: the error body's ``status`` name and its sanitized ``details``."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        transient: bool = False,
        retry_after_s: float | None = None,
        said: str | None = None,
        rpc_status: str | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.transient = transient
        self.retry_after_s = retry_after_s
        self.said = said
        self.rpc_status = rpc_status
        self.details = details or []

    @property
    def sentence(self) -> str:
        return self.said or self.message

    @property
    def not_found(self) -> bool:
        return self.status == 404


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Timeouts and connection failures of whichever httpx flavour the SDK runs on."""
    found: list[type[BaseException]] = []
    for module_name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cls = getattr(module, "TransportError", None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    try:
        from google.genai._interactions import APIConnectionError

        found.append(APIConnectionError)
    except ImportError:  # pragma: no cover - older SDKs
        pass
    return tuple(found)


def retry_after_s(headers: Any, now_s: float | None = None) -> float | None:
    """``Retry-After`` of a response's headers in seconds (delta-seconds or an HTTP date)."""
    if headers is None:
        return None
    try:
        raw = headers.get("retry-after")
    except Exception:
        return None
    if not isinstance(raw, str) or not raw.strip():
        return None
    text = raw.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    import time

    now = time.time() if now_s is None else now_s
    return max(0.0, when.timestamp() - now)


def _said(status: object, message: object) -> str | None:
    """``PERMISSION_DENIED: API key not valid``: what the server said, for the sentence."""
    return ": ".join(str(part) for part in (status, message) if part) or None


def classify(exc: BaseException) -> GatewayError:
    """An SDK exception as a ``GatewayError``."""
    message = f"{type(exc).__name__}: {exc}"[:300]
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, _transport_errors()):
        return GatewayError(message, status=None, transient=True)
    from google.genai import errors as genai_errors

    status: object
    headers: Any = None
    said: str | None = None
    error: object = None
    if isinstance(exc, genai_errors.APIError):
        status = exc.code
        headers = getattr(exc.response, "headers", None)
        said = _said(exc.status, exc.message)
        body = exc.details  # google-genai keeps the whole response JSON here
        error = body.get("error", body) if isinstance(body, dict) else None
    else:
        status = getattr(exc, "status_code", None)
        headers = getattr(getattr(exc, "response", None), "headers", None)
        body = getattr(exc, "body", None)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            said = _said(error.get("status"), error.get("message"))
    rpc_status = error.get("status") if isinstance(error, dict) else None
    details = sanitize_details(error.get("details")) if isinstance(error, dict) else []
    if isinstance(status, int) and not isinstance(status, bool):
        return GatewayError(
            message,
            status=status,
            transient=status in TRANSIENT_STATUSES,
            retry_after_s=retry_after_s(headers) if status in TRANSIENT_STATUSES else None,
            said=said,
            rpc_status=rpc_status if isinstance(rpc_status, str) else None,
            details=details,
        )
    return GatewayError(message, status=None, transient=False)
