"""One canonical key per Gemini resource, whatever spelling it arrived in.

Accepted spellings include ``batches/x``, ``/v1beta/batches/x``, ``v1/batches/x``,
``https://generativelanguage.googleapis.com/v1beta/batches/x?alt=json``, ``batches/x:cancel``,
``models/veo-3.1-generate-preview/operations/x`` and ``fileSearchStores/s/operations/o``.

A video (Veo) operation is keyed without its model:
``models/veo-3.1-generate-preview/operations/x``, ``models/-/operations/x``, and a bare ``x`` or
``operations/x`` arriving as a video (a webhook's ``data.id``) all become
``models/-/operations/x`` (``-`` is the Google APIs wildcard for "any model"), so a webhook
that names only the id and a producer that tracked the full name meet on one record.
``parse_name`` also returns the model, which the normalisers keep in ``details.model`` so the
reconciler can rebuild the full name to poll (``api_name``). Records written before this rule
are keyed by the full name: ``legacy_names`` gives the key such a record has, so a lookup can
fall back to it.

Google Cloud (Vertex AI) resources are keyed by their full resource name, project, location (and
a Veo operation's model) included: ``projects/P/locations/L/batchPredictionJobs/N`` (a batch) and
``projects/P/locations/L/publishers/google/models/M/operations/ID`` (a video). A Cloud batch job
named without its project and location (``batchPredictionJobs/N``, or the bare number the SDK
also accepts) is refused: the same number can exist in every project. Project and location ids
are Google's: lowercase letters, digits and hyphens (a project number is digits). Google reads
a location in any case, so ``US-CENTRAL1`` is keyed as ``us-central1``; a project id in another
case, any other character in either (``evil.example``) and a ``projects/...`` name that is no
batch job or Veo operation (``projects/p/locations/l``, what ``.../l#/batchPredictionJobs/1``
leaves) are refused. A record an earlier release keyed with the location as written is found by
that spelling through ``ParsedName.legacy``. ``backend_of`` says which service a key belongs to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

MAX_NAME_LENGTH = 512

_ALLOWED = re.compile(r"[A-Za-z0-9._~\-/]+", re.ASCII)
_API_VERSION = re.compile(r"v\d+(?:(?:alpha|beta)\d*)?", re.ASCII)
_URL = re.compile(r"https?://[^/]+(?P<path>/.*)?", re.ASCII | re.IGNORECASE)
_SEGMENT = re.compile(r"[A-Za-z0-9._~\-]+", re.ASCII)
# The model segment of every canonical video key: the Google APIs wildcard for "any model".
ANY_MODEL = "-"
VIDEO_DETAIL = "model"

# The service a key belongs to (``backend_of``).
Backend = Literal["gemini-api", "google-cloud"]
GEMINI_API: Backend = "gemini-api"
GOOGLE_CLOUD: Backend = "google-cloud"
# Segments of the Google Cloud resource names this system follows.
CLOUD_BATCH_COLLECTION = "batchPredictionJobs"
_CLOUD_BATCH = re.compile(r"projects/[^/]+/locations/[^/]+/batchPredictionJobs/[^/]+", re.ASCII)
_CLOUD_VIDEO = re.compile(
    r"projects/[^/]+/locations/[^/]+/publishers/[^/]+/models/[^/]+/operations/[^/]+", re.ASCII
)
# A Google Cloud project id or number, and a location id (after lowercasing): Google's alphabet.
_CLOUD_ID = re.compile(r"[a-z0-9-]+", re.ASCII)


class Kind(StrEnum):
    """What sort of long-running operation a name refers to."""

    BATCH = "batch"
    VIDEO = "video"
    INTERACTION = "interaction"
    FILE_SEARCH_IMPORT = "file_search_import"
    OPERATION = "operation"
    JOB = "job"  # opstate's own: one input fed to Gemini as parts (issue 46), never polled


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


@dataclass(frozen=True, slots=True)
class ParsedName:
    """A canonical key, the video model the raw name carried (None for anything else), and
    ``legacy``: the key an earlier release gave the same spelling when it differs (a Google
    Cloud location not written in lowercase), for a lookup to fall back to."""

    key: str
    model: str | None = None
    legacy: tuple[str, ...] = ()


def canonical_name(raw: object, kind_hint: Kind | str | None = None) -> str:
    """The canonical key of a resource name, or ``InvalidNameError``.

    Strips a scheme and host, a query string or fragment, a leading ``/``, an API version
    prefix (``v1``, ``v1beta``, ``v1beta1``, ``v1alpha``) and a trailing ``:verb``. A bare id
    (no ``/``) becomes ``batches/<id>``, ``interactions/<id>`` or ``models/-/operations/<id>``
    when the hint names that kind; any other bare id is rejected because it names no
    collection. A video operation's model becomes ``-`` (see the module docstring).
    """
    return parse_name(raw, kind_hint).key


def parse_name(raw: object, kind_hint: Kind | str | None = None) -> ParsedName:
    """``canonical_name`` and the video model of ``raw`` (when it named one)."""
    if not isinstance(raw, str):
        raise InvalidNameError(raw, "expected a string")
    text = _resource_path(raw)
    # The hint matters only for a bare id or a bare "operations/<id>" (which must be a video).
    needs_hint = "/" not in text or text.startswith("operations/")
    hint = _parse_kind(kind_hint) if needs_hint else None
    if "/" not in text:
        text = _bare_id_key(raw, text, hint)
    text, model = _video_key(raw, text, hint)
    _check_key(raw, text)
    key = _cloud_key(raw, text)
    return ParsedName(key, model, (text,) if key != text else ())


def _resource_path(raw: str) -> str:
    """``raw`` without scheme and host, query or fragment, leading ``/``, API version or
    trailing ``:verb``; ``InvalidNameError`` when nothing (or far too much) is left."""
    text = raw.strip()
    if not text:
        raise InvalidNameError(raw, "empty")
    if len(text) > MAX_NAME_LENGTH * 2:
        raise InvalidNameError(raw, f"longer than {MAX_NAME_LENGTH} characters")
    url = _URL.fullmatch(text)
    if url is not None:
        text = url.group("path") or ""
    for sep in ("?", "#"):
        text = text.partition(sep)[0]
    segments = text.lstrip("/").split("/")
    if _API_VERSION.fullmatch(segments[0]) and len(segments) > 1:
        segments = segments[1:]
    segments[-1] = segments[-1].partition(":")[0]
    text = "/".join(segments)
    if not text:
        raise InvalidNameError(raw, "empty")
    return text


def _bare_id_key(raw: str, text: str, hint: Kind | None) -> str:
    """The key of a bare id: in the collection ``hint`` names, or ``InvalidNameError``."""
    if hint is Kind.VIDEO:
        return f"models/{ANY_MODEL}/operations/{text}"
    collection = _BARE_ID_COLLECTION.get(hint) if hint is not None else None
    if collection is None:
        raise InvalidNameError(raw, "a bare id names no collection (expected e.g. 'batches/<id>')")
    return f"{collection}/{text}"


def _video_key(raw: str, text: str, hint: Kind | None) -> tuple[str, str | None]:
    """(key, model): a video operation keyed under ``models/-``, with the model it named."""
    parts = text.split("/")
    if hint is Kind.VIDEO and len(parts) == 2 and parts[0] == "operations":
        return f"models/{ANY_MODEL}/{text}", None
    if len(parts) == 4 and _is_video_model(parts) and parts[1] != ANY_MODEL:
        model = parts[1]
        if _SEGMENT.fullmatch(model) is None:
            raise InvalidNameError(raw, "only A-Z a-z 0-9 . _ ~ - and / are allowed")
        return f"models/{ANY_MODEL}/operations/{parts[3]}", model
    return text, None


def _check_key(raw: str, text: str) -> None:
    """``InvalidNameError`` unless ``text`` is a well-formed key."""
    if len(text) > MAX_NAME_LENGTH:
        raise InvalidNameError(raw, f"longer than {MAX_NAME_LENGTH} characters")
    if _ALLOWED.fullmatch(text) is None:
        raise InvalidNameError(raw, "only A-Z a-z 0-9 . _ ~ - and / are allowed")
    for segment in text.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidNameError(raw, "empty, '.' or '..' path segment")


def _cloud_key(raw: str, text: str) -> str:
    """``text``, with a Google Cloud name's location in lowercase; ``InvalidNameError`` for a
    Cloud batch job named without its project and location, a project or location id outside
    Google's alphabet, and a ``projects/...`` name that is no batch job or Veo operation."""
    parts = text.split("/")
    if CLOUD_BATCH_COLLECTION in parts and _CLOUD_BATCH.fullmatch(text) is None:
        raise InvalidNameError(
            raw,
            "a Google Cloud batch job needs its full name "
            "'projects/<project>/locations/<location>/batchPredictionJobs/<id>' "
            "(its number alone is ambiguous across projects)",
        )
    if parts[0] != "projects":
        return text
    if len(parts) < 4 or parts[2] != "locations":
        raise InvalidNameError(
            raw, "a Google Cloud name starts 'projects/<project>/locations/<location>/'"
        )
    if _CLOUD_ID.fullmatch(parts[1]) is None:
        raise InvalidNameError(
            raw,
            "a Google Cloud project id is lowercase letters, digits and hyphens "
            "(a project number is digits)",
        )
    parts[3] = parts[3].lower()
    if _CLOUD_ID.fullmatch(parts[3]) is None:
        raise InvalidNameError(
            raw, "a Google Cloud location is letters, digits and hyphens (e.g. us-central1)"
        )
    key = "/".join(parts)
    if _CLOUD_BATCH.fullmatch(key) is None and _CLOUD_VIDEO.fullmatch(key) is None:
        raise InvalidNameError(
            raw,
            "a Google Cloud name must be a batch job "
            "('projects/<project>/locations/<location>/batchPredictionJobs/<id>') or a Veo "
            "operation ('.../publishers/<publisher>/models/<model>/operations/<id>')",
        )
    return key


def backend_of(name: str) -> Backend:
    """The service a canonical key belongs to: Google Cloud for ``projects/...`` resources,
    the Gemini API for everything else."""
    return GOOGLE_CLOUD if name.startswith("projects/") else GEMINI_API


def cloud_scope(name: str) -> tuple[str, str] | None:
    """(project, location) of a Google Cloud key; None for any other key."""
    parts = name.split("/")
    if len(parts) < 4 or parts[0] != "projects" or parts[2] != "locations":
        return None
    return parts[1], parts[3]


def _is_video_model(parts: list[str]) -> bool:
    """``models/<veo model or ->/operations/<id>``."""
    return (
        len(parts) == 4
        and parts[0] == "models"
        and parts[2] == "operations"
        and (parts[1].startswith("veo") or parts[1] == ANY_MODEL)
    )


def _model_of(details: Mapping[str, Any]) -> str | None:
    model = details.get(VIDEO_DETAIL)
    if (
        isinstance(model, str)
        and model.startswith("veo")
        and _SEGMENT.fullmatch(model)
        and model not in (".", "..")
    ):
        return model
    return None


def legacy_names(key: str, details: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys a record of ``key`` may have been stored under by an earlier release: a video
    operation was keyed by its full name, ``models/<model>/operations/<id>``."""
    parts = key.split("/")
    model = _model_of(details)
    if model is None or not _is_video_model(parts) or parts[1] != ANY_MODEL:
        return ()
    return (f"models/{model}/operations/{parts[3]}",)


def api_name(key: str, details: Mapping[str, Any]) -> str:
    """The resource name to ask the Gemini API for: a video key with its model put back (from
    ``details.model``); any other key as is."""
    legacy = legacy_names(key, details)
    return legacy[0] if legacy else key


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
    if _CLOUD_BATCH.fullmatch(name):
        return Kind.BATCH
    if _CLOUD_VIDEO.fullmatch(name):
        return Kind.VIDEO
    segments = name.split("/")
    head = segments[0]
    if head == "batches":
        return Kind.BATCH
    if head == "interactions":
        return Kind.INTERACTION
    if head == "jobs":
        return Kind.JOB
    if head == "fileSearchStores" and "operations" in segments:
        return Kind.FILE_SEARCH_IMPORT
    if (
        head == "models"
        and len(segments) >= 2
        and (segments[1].startswith("veo") or segments[1] == ANY_MODEL)
    ):
        return Kind.VIDEO
    return Kind.OPERATION
