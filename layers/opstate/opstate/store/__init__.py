"""Stores behind one small port: DynamoDB (production), SQLite (embedded), memory (tests).

``store_from_url`` builds one from a URL; the DynamoDB, SQLite and memory modules are imported
only when such a store is asked for (boto3 is not needed to run on SQLite; ``MemoryStore`` is
loaded by its first use).

Owns: ``port`` (the ``Store`` protocol, write outcomes, ``RetryableError`` and
``StoreUnavailableError``, ``expires_at``), ``retry_state`` (the retry state beside a record,
pure), ``dynamodb`` (with ``dynamodb_items``, the item codec, no boto3, ``dynamodb_client``, the
client and its error mapping, and its parts ``dynamodb_polls``, ``dynamodb_archives`` and
``dynamodb_retries``), ``sqlite`` (with ``sqlite_schema``, ``sqlite_polls``, ``sqlite_archives``
and ``sqlite_retries``) and ``memory`` (one store each, all passing the same contract tests)
and ``store_from_url``.
May import the domain (``model``, ``states``, ``times``, ``details``) and ``config``, and boto3
(``dynamodb`` and ``dynamodb_client`` only); never ingest, the API, the reconciler, the notifier,
the local server or the CLI.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opstate.store.port import (
    WRITTEN,
    Due,
    PollingStore,
    PollState,
    RetryableError,
    Store,
    StoreUnavailableError,
    WriteOutcome,
)

if TYPE_CHECKING:
    from opstate.config import StoreSettings
    from opstate.store.memory import MemoryStore

__all__ = [
    "WRITTEN",
    "Due",
    "MemoryStore",
    "PollState",
    "PollingStore",
    "RetryableError",
    "Store",
    "StoreUnavailableError",
    "WriteOutcome",
    "store_from_url",
]

URL_FORMS = "dynamodb://TABLE, sqlite:///relative/path.db, sqlite:////absolute/path.db, memory://"


def store_from_url(url: str, settings: StoreSettings | None = None) -> Store:
    """The store a URL names.

    - ``dynamodb://TABLE``: ``DynamoDBStore`` on TABLE (shards and retention from ``settings``;
      the endpoint from boto3's own configuration, e.g. ``AWS_ENDPOINT_URL_DYNAMODB``).
    - ``sqlite:///PATH``: ``SQLiteStore``; as in SQLAlchemy, ``sqlite:///ops.db`` is relative to
      the working directory and ``sqlite:////var/lib/ops.db`` is absolute. Missing parent
      directories are created.
    - ``memory://``: a fresh ``MemoryStore`` (tests; forgets everything on exit).

    Anything else raises ``ValueError`` naming the accepted forms.
    """
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise ValueError(f"invalid store URL {url!r}: expected one of {URL_FORMS}")
    build = _BUILDERS.get(scheme.lower())
    if build is None:
        raise ValueError(f"unsupported store URL {url!r}: expected one of {URL_FORMS}")
    return build(url, rest, settings)


def _memory_store(url: str, rest: str, settings: StoreSettings | None) -> Store:
    if rest.strip("/"):
        raise ValueError(f"invalid store URL {url!r}: memory:// takes no path")
    from opstate.store.memory import MemoryStore

    return MemoryStore()


def _dynamodb_store(url: str, rest: str, settings: StoreSettings | None) -> Store:
    table = rest.strip("/")
    if not table or "/" in table:
        raise ValueError(f"invalid store URL {url!r}: expected dynamodb://TABLE")
    from opstate.store.dynamodb import DynamoDBStore

    if settings is None:
        return DynamoDBStore(table)
    return DynamoDBStore(
        table, shards=settings.open_index_shards, retention_days=settings.retention_days
    )


def _sqlite_store(url: str, rest: str, settings: StoreSettings | None) -> Store:
    if not rest.startswith("/") or rest in ("/", "//") or rest.endswith("/"):
        raise ValueError(
            f"invalid store URL {url!r}: expected sqlite:///relative.db or sqlite:////absolute.db"
        )
    raw_path = rest[1:]  # "sqlite:///a.db" -> "a.db"; "sqlite:////a.db" -> "/a.db"
    if raw_path == ":memory:":
        raise ValueError(f"invalid store URL {url!r}: use memory:// for an in-memory store")
    path = Path(raw_path).expanduser()
    from opstate.private_files import make_private_dir
    from opstate.store.sqlite import SQLiteStore

    make_private_dir(path.parent)  # .opstate/ is 0700 (opstate.private_files)

    if settings is None:
        return SQLiteStore(path)
    return SQLiteStore(path, retention_days=settings.retention_days)


def __getattr__(name: str) -> Any:
    """``MemoryStore`` on first use: the memory store is for tests and ``memory://``, so a
    DynamoDB or SQLite process never loads it (docs/api.md, "Cold start")."""
    if name != "MemoryStore":
        raise AttributeError(f"module 'opstate.store' has no attribute {name!r}")
    value = importlib.import_module("opstate.store.memory").MemoryStore
    globals()[name] = value
    return value


# scheme (lower case) -> builder(url, the part after "://", settings)
_BUILDERS: dict[str, Callable[[str, str, StoreSettings | None], Store]] = {
    "memory": _memory_store,
    "dynamodb": _dynamodb_store,
    "sqlite": _sqlite_store,
}
