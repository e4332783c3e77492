"""The store's settings (``store_from_url``) and ingest's conditional writes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opstate.config.parse import Part, given, read_float, read_int, read_str, settings_part

DEFAULT_LOCAL_STORE = "sqlite:///.opstate/ops.db"
# Defaults other modules need too (the stores' own keyword defaults).
DEFAULT_OPEN_INDEX_SHARDS = 4
DEFAULT_RETENTION_DAYS = 90
DEFAULT_INGEST_MAX_ATTEMPTS = 8
# How far ahead of the receiver's clock an event's time may be (reports 400, webhooks are
# quarantined, polls skipped beyond it): a time far in the future would freeze a record.
DEFAULT_MAX_FUTURE_SKEW_S = 3600.0
MAX_FUTURE_SKEW_LIMIT_S = 7 * 86400.0
_SQLITE_PREFIX = "sqlite:///"


def sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite:///PATH`` URL names, as ``store_from_url`` opens it (``sqlite:///a.db``
    relative to the working directory, ``sqlite:////a.db`` absolute, ``~`` expanded); None for
    any other URL. Reading it creates nothing."""
    text = url.strip()
    if not text.lower().startswith(_SQLITE_PREFIX) or len(text) == len(_SQLITE_PREFIX):
        return None
    return Path(text[len(_SQLITE_PREFIX) :]).expanduser()


def store_location(url: str) -> str:
    """The store URL as an operator finds it again: a SQLite file named relative to the
    working directory (the default ``.opstate/ops.db``) or with ``~`` gets its absolute path
    beside the URL, so a ``cd`` elsewhere cannot hide where the jobs are."""
    path = sqlite_file(url)
    if path is None:
        return url.strip()
    shown = path.absolute()
    if str(shown) == url.strip()[len(_SQLITE_PREFIX) :]:
        return url.strip()
    return f"{url.strip()} ({shown})"


@settings_part
class StoreSettings(Part):
    """The store (``store_from_url``) and ingest's conditional writes."""

    # A URL (dynamodb://TABLE or sqlite:///PATH). In Lambda, OPSTATE_TABLE_NAME is set by the
    # template and wins over the local default.
    store_url: str = DEFAULT_LOCAL_STORE
    open_index_shards: int = DEFAULT_OPEN_INDEX_SHARDS
    retention_days: int = DEFAULT_RETENTION_DAYS
    ingest_max_attempts: int = DEFAULT_INGEST_MAX_ATTEMPTS
    # Every input path (reports, webhooks, polls) refuses an event time further ahead.
    max_future_skew_s: float = DEFAULT_MAX_FUTURE_SKEW_S

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        table = read_str(env, "OPSTATE_TABLE_NAME")
        return given(
            store_url=read_str(env, "OPSTATE_STORE") or (f"dynamodb://{table}" if table else None),
            open_index_shards=read_int(env, "OPSTATE_OPEN_INDEX_SHARDS", minimum=1),
            retention_days=read_int(env, "OPSTATE_RETENTION_DAYS", minimum=1),
            ingest_max_attempts=read_int(env, "OPSTATE_INGEST_MAX_ATTEMPTS", minimum=1),
            max_future_skew_s=read_float(
                env,
                "OPSTATE_MAX_FUTURE_SKEW_SECONDS",
                minimum=1.0,
                maximum=MAX_FUTURE_SKEW_LIMIT_S,
            ),
        )
