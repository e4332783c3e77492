"""Reading a request: its body as the sender's bytes (with the size limit), its JSON, its
headers."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from opstate.api.errors import ApiError
from opstate.domain.strict_json import InvalidJSONError, loads

MAX_LOGGED_ID = 128


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
    if event.get("isBase64Encoded"):
        # n base64 characters decode to at most 3n/4 bytes.
        if (len(body) // 4) * 3 > max_bytes + 3:
            raise _too_large(max_bytes)
        try:
            raw = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "invalid-body", "the body is not valid base64") from None
    else:
        if len(body) > max_bytes:  # every character is at least one byte
            raise _too_large(max_bytes)
        raw = body.encode("utf-8", "surrogatepass")
    if len(raw) > max_bytes:
        raise _too_large(max_bytes)
    return raw


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, "payload-too-large", f"the body is larger than {max_bytes} bytes")


def request_headers(event: Mapping[str, Any]) -> dict[str, str]:
    """The event's headers with lower-case names (non-text values dropped)."""
    headers = event.get("headers") or {}
    if not isinstance(headers, Mapping):
        return {}
    return {str(k).lower(): v for k, v in headers.items() if isinstance(v, str)}


def clip(text: str | None) -> str | None:
    """``text`` cut to ``MAX_LOGGED_ID`` characters for the logs (a sender-chosen id)."""
    if text is None:
        return None
    return text if len(text) <= MAX_LOGGED_ID else text[: MAX_LOGGED_ID - 3] + "..."
