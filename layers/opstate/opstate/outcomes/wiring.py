"""Wiring: settings -> store + Gemini source + sink -> one archive pass; the sink of a URL.
(``results_json``, the ``opstate results --json`` document of a name, is in ``results``.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from opstate.config import ConfigError, ResultsSettings, Settings
from opstate.outcomes.results import results_json
from opstate.outcomes.run import ArchiveResult, archive_once
from opstate.outcomes.sink import Sink
from opstate.store.port import ArchivingStore, Store

__all__ = [
    "archive_from_settings",
    "names_of",
    "results_json",
    "results_url_for",
    "sink_from_url",
]

URL_FORMS = "s3://BUCKET/PREFIX or file:///ABS/PATH"
LOCAL_RESULTS_DIR = "results"


def results_url_for(settings: Settings) -> str:
    """``OPSTATE_RESULTS_URL``, else ``results/`` beside a SQLite store's file."""
    if settings.results_url:
        return settings.results_url
    scheme, _, rest = settings.store_url.partition("://")
    if scheme.lower() == "sqlite" and rest.startswith("/"):
        path = Path(rest[1:]).expanduser().resolve()
        return (path.parent / LOCAL_RESULTS_DIR).as_uri()
    raise ConfigError(f"OPSTATE_RESULTS_URL must name where results are archived ({URL_FORMS})")


def sink_from_url(url: str, settings: ResultsSettings | None = None) -> Sink:
    """The sink a URL names (``ValueError`` for anything else)."""
    parts = urlsplit(url)
    if parts.scheme == "file" and parts.path.startswith("/") and not parts.netloc:
        from opstate.outcomes.file_sink import FileSink

        return FileSink(unquote(parts.path))
    if parts.scheme == "s3" and parts.netloc:
        from opstate.outcomes.s3_sink import S3Sink

        part_mib = settings.results_part_mib if settings is not None else None
        return S3Sink(
            parts.netloc, parts.path, part_size=part_mib * 1024 * 1024 if part_mib else None
        )
    raise ValueError(f"invalid results URL {url!r}: expected {URL_FORMS}")


def archiving(store: Store) -> ArchivingStore:
    if not isinstance(store, ArchivingStore):  # pragma: no cover - every store of ours is
        raise TypeError(f"{type(store).__name__} cannot keep archive states")
    return store


def names_of(event: Any) -> list[str] | None:
    """The operation a bus trigger names (``detail.name`` of an ``Operation State Changed``),
    as a list; None for any other event (the reconciler's re-drive, a manual invoke): then the
    pass takes every due archive."""
    if not isinstance(event, dict) or event.get("detail-type") != "Operation State Changed":
        return None
    detail = event.get("detail")
    name = detail.get("name") if isinstance(detail, dict) else None
    return [name] if isinstance(name, str) and name else None


def archive_from_settings(
    settings: Settings,
    remaining_s: Callable[[], float] | None = None,
    *,
    store: Store | None = None,
    names: list[str] | None = None,
) -> ArchiveResult:
    """Open the configured store (unless given), a google-genai client and the sink; one
    pass (over ``names`` only, when given); close what was opened here."""
    from opstate.outcomes.genai_source import GenaiSource, make_client
    from opstate.store import store_from_url

    sink = sink_from_url(results_url_for(settings), settings)
    opened = store is None
    used = store if store is not None else store_from_url(settings.store_url, settings)
    try:
        source = GenaiSource(make_client(settings))
        try:
            return archive_once(
                archiving(used),
                source,
                sink,
                settings=settings,
                remaining_s=remaining_s,
                safety_s=settings.reconcile_safety_margin_s,
                names=names,
            )
        finally:
            source.close()
    finally:
        if opened:
            used.close()
