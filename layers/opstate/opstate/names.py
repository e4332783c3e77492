"""One canonical key per Gemini resource, whatever spelling it arrived in.

Accepted spellings include ``batches/x``, ``/v1beta/batches/x``, ``v1/batches/x``,
``https://generativelanguage.googleapis.com/v1beta/batches/x?alt=json``, ``batches/x:cancel``,
``models/veo-3.1-generate-preview/operations/x`` and ``fileSearchStores/s/operations/o``.
"""

from __future__ import annotations

import re
from enum import StrEnum

MAX_NAME_LENGTH = 512

_ALLOWED = re.compile(r"[A-Za-z0-9._~\-/]+", re.ASCII)
_API_VERSION = re.compile(r"v\d+(?:(?:alpha|beta)\d*)?", re.ASCII)
_URL = re.compile(r"https?://[^/]+(?P<path>/.*)?", re.ASCII | re.IGNORECASE)


class Kind(StrEnum):
    """What sort of long-running operation a name refers to."""

    BATCH = "batch"
    VIDEO = "video"
    INTERACTION = "interaction"
    FILE_SEARCH_IMPORT = "file_search_import"
    OPERATION = "operation"


# The collection a bare id belongs to, by kind hint.
_BARE_ID_COLLECTION: dict[Kind, str] = {
    Kind.BATCH: "batches",
    Kind.INTERACTION: "interactions",
}


class InvalidNameError(ValueError):
    """A value that cannot be a Gemini resource name."""

    def __init__(self, value: object, why: str) -> None:
        shown = value if not isinstance(value, str) or len(value) <= 80 else value[:77] + "..."
        super().__init__(f"invalid operation name {shown!r}: {why}")
        self.value = value
        self.why = why


def canonical_name(raw: object, kind_hint: Kind | str | None = None) -> str:
    """The canonical key of a resource name, or ``InvalidNameError``.

    Strips a scheme and host, a query string or fragment, a leading ``/``, an API version
    prefix (``v1``, ``v1beta``, ``v1beta1``, ``v1alpha``) and a trailing ``:verb``. A bare id
    (no ``/``) becomes ``batches/<id>`` or ``interactions/<id>`` when the hint names that kind;
    any other bare id is rejected because it names no collection.
    """
    if not isinstance(raw, str):
        raise InvalidNameError(raw, "expected a string")
    text = raw.strip()
    if not text:
        raise InvalidNameError(raw, "empty")
    if len(text) > MAX_NAME_LENGTH * 2:
        raise InvalidNameError(raw, f"longer than {MAX_NAME_LENGTH} characters")
    url = _URL.fullmatch(text)
    if url is not None:
        text = url.group("path") or ""
    for sep in ("?", "#"):
        text = text.split(sep, 1)[0]
    text = text.lstrip("/")
    segments = text.split("/")
    if segments and _API_VERSION.fullmatch(segments[0]) and len(segments) > 1:
        segments = segments[1:]
    if segments:
        last = segments[-1]
        if ":" in last:
            segments[-1] = last.split(":", 1)[0]
    text = "/".join(segments)
    if not text:
        raise InvalidNameError(raw, "empty")
    if "/" not in text:
        hint = _parse_kind(kind_hint)
        collection = _BARE_ID_COLLECTION.get(hint) if hint is not None else None
        if collection is None:
            raise InvalidNameError(
                raw, "a bare id names no collection (expected e.g. 'batches/<id>')"
            )
        text = f"{collection}/{text}"
    if len(text) > MAX_NAME_LENGTH:
        raise InvalidNameError(raw, f"longer than {MAX_NAME_LENGTH} characters")
    if _ALLOWED.fullmatch(text) is None:
        raise InvalidNameError(raw, "only A-Z a-z 0-9 . _ ~ - and / are allowed")
    for segment in text.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidNameError(raw, "empty, '.' or '..' path segment")
    return text


def _parse_kind(value: Kind | str | None) -> Kind | None:
    if value is None or isinstance(value, Kind):
        return value
    try:
        return Kind(value)
    except ValueError:
        expected = ", ".join(Kind)
        raise InvalidNameError(value, f"unknown kind hint; expected one of {expected}") from None


def kind_of(name: str) -> Kind:
    """The kind of operation a canonical name refers to."""
    segments = name.split("/")
    head = segments[0]
    if head == "batches":
        return Kind.BATCH
    if head == "interactions":
        return Kind.INTERACTION
    if head == "fileSearchStores" and "operations" in segments:
        return Kind.FILE_SEARCH_IMPORT
    if head == "models" and len(segments) >= 2 and segments[1].startswith("veo"):
        return Kind.VIDEO
    return Kind.OPERATION
