"""All configuration, read once, in one place, from documented environment variables.

The package owns the settings: one frozen dataclass per part, each in a module of its own and
reading its own variables (``store.StoreSettings``, ``webhook.WebhookSettings``,
``reconcile.ReconcileSettings``, ``results.ResultsSettings``, ``notify.NotifySettings``,
``local.LocalSettings``, ``waiters.WaiterSettings``, ``retry.RetrySettings``,
``submit.SubmitSettings``, ``metrics.MetricsSettings``; ``google_cloud``
reads what two of them hold for Google Cloud, ``parse`` holds the readers and ``ConfigError``),
and ``Settings``, all of them at once, here. Every default is written once, as the field's
default: ``env_values`` returns only the variables that are set, so an unset one falls back to
that same default. Secret values (webhook secrets, the Gemini API key, the API token) never
appear in a ``repr``.

``settings()`` reads ``os.environ`` on first use and caches the result; ``Settings.from_env``
(or a part's ``from_env``) builds one from any mapping (tests). A bad value raises
``ConfigError`` naming the variable. The README's configuration table lists every variable read
in this package. Every name other modules import is imported from ``opstate.config`` itself
(re-exported below), never from a module of the package.

It may import the standard library and ``opstate.domain`` only: every Lambda entry imports it
at init (the webhook's cold start stays lean, tests/integration/test_cold_start.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from opstate.config.google_cloud import DEFAULT_PUBSUB_JWKS_URL, PUBSUB_ISSUERS
from opstate.config.local import (
    DEFAULT_QUARANTINE_MAX_BYTES,
    DEFAULT_QUARANTINE_MAX_ENTRIES,
    DEFAULT_RECONCILE_EVERY_S,
    MIN_API_TOKEN_LENGTH,
    LocalSettings,
    checked_api_token,
    serve_store_url,
)
from opstate.config.metrics import MetricsSettings, detailed_metrics
from opstate.config.notify import NotifySettings
from opstate.config.parse import MAX_SECONDS, ConfigError, Part, settings_part
from opstate.config.reconcile import (
    DEFAULT_OVERDUE_HOURS,
    DEFAULT_RECONCILE_BUDGET_S,
    ReconcileSettings,
    parse_overdue,
)
from opstate.config.results import (
    DEFAULT_RESULTS_RETENTION_HOURS,
    DEFAULT_RESULTS_WARN_HOURS,
    ResultsSettings,
)
from opstate.config.retry import (
    DEFAULT_RETRY_MAX_BATCHES,
    DEFAULT_RETRY_MAX_ROWS,
    DEFAULT_RETRY_TRANSIENT,
    MAX_RETRY_ATTEMPTS,
    RetrySettings,
)
from opstate.config.store import (
    DEFAULT_INGEST_MAX_ATTEMPTS,
    DEFAULT_LOCAL_STORE,
    DEFAULT_MAX_FUTURE_SKEW_S,
    DEFAULT_OPEN_INDEX_SHARDS,
    DEFAULT_RETENTION_DAYS,
    MAX_FUTURE_SKEW_LIMIT_S,
    StoreSettings,
    sqlite_file,
    store_location,
)
from opstate.config.submit import (
    DEFAULT_SUBMIT_MAX_BATCHES,
    DEFAULT_SUBMIT_MAX_FILE_BYTES,
    DEFAULT_SUBMIT_MAX_ROWS,
    TIER1_ENQUEUED_TOKENS,
    SubmitSettings,
    model_id,
    parse_enqueued_tokens,
)
from opstate.config.waiters import DEFAULT_MAX_WAITERS, WaiterSettings
from opstate.config.webhook import (
    DEFAULT_JWKS_MAX_STALE_S,
    DEFAULT_JWKS_TIMEOUT_S,
    DEFAULT_JWKS_URL,
    DEFAULT_JWT_LEEWAY_S,
    DEFAULT_JWT_MAX_LIFETIME_S,
    DEFAULT_WEBHOOK_TOLERANCE_S,
    WebhookSettings,
)

__all__ = [
    "DEFAULT_INGEST_MAX_ATTEMPTS",
    "DEFAULT_JWKS_MAX_STALE_S",
    "DEFAULT_JWKS_TIMEOUT_S",
    "DEFAULT_JWKS_URL",
    "DEFAULT_JWT_LEEWAY_S",
    "DEFAULT_JWT_MAX_LIFETIME_S",
    "DEFAULT_LOCAL_STORE",
    "DEFAULT_MAX_FUTURE_SKEW_S",
    "DEFAULT_MAX_WAITERS",
    "DEFAULT_OPEN_INDEX_SHARDS",
    "DEFAULT_OVERDUE_HOURS",
    "DEFAULT_PUBSUB_JWKS_URL",
    "DEFAULT_QUARANTINE_MAX_BYTES",
    "DEFAULT_QUARANTINE_MAX_ENTRIES",
    "DEFAULT_RECONCILE_BUDGET_S",
    "DEFAULT_RECONCILE_EVERY_S",
    "DEFAULT_RESULTS_RETENTION_HOURS",
    "DEFAULT_RESULTS_WARN_HOURS",
    "DEFAULT_RETENTION_DAYS",
    "DEFAULT_RETRY_MAX_BATCHES",
    "DEFAULT_RETRY_MAX_ROWS",
    "DEFAULT_RETRY_TRANSIENT",
    "DEFAULT_SUBMIT_MAX_BATCHES",
    "DEFAULT_SUBMIT_MAX_FILE_BYTES",
    "DEFAULT_SUBMIT_MAX_ROWS",
    "DEFAULT_WEBHOOK_TOLERANCE_S",
    "MAX_FUTURE_SKEW_LIMIT_S",
    "MAX_RETRY_ATTEMPTS",
    "MAX_SECONDS",
    "MIN_API_TOKEN_LENGTH",
    "PARTS",
    "PUBSUB_ISSUERS",
    "TIER1_ENQUEUED_TOKENS",
    "ConfigError",
    "LocalSettings",
    "MetricsSettings",
    "NotifySettings",
    "ReconcileSettings",
    "ResultsSettings",
    "RetrySettings",
    "Settings",
    "StoreSettings",
    "SubmitSettings",
    "WaiterSettings",
    "WebhookSettings",
    "checked_api_token",
    "detailed_metrics",
    "model_id",
    "parse_enqueued_tokens",
    "parse_overdue",
    "serve_store_url",
    "settings",
    "sqlite_file",
    "store_location",
]

PARTS: tuple[type[Part], ...] = (
    StoreSettings,
    WebhookSettings,
    ReconcileSettings,
    ResultsSettings,
    NotifySettings,
    LocalSettings,
    WaiterSettings,
    RetrySettings,
    SubmitSettings,
    MetricsSettings,
)


@settings_part
class Settings(
    MetricsSettings,
    SubmitSettings,
    RetrySettings,
    WaiterSettings,
    LocalSettings,
    NotifySettings,
    ResultsSettings,
    ReconcileSettings,
    WebhookSettings,
    StoreSettings,
):
    """Every part's settings in one object (fields in the order of ``PARTS``).

    A ``Settings`` is each of its parts, so code that needs one part takes that part's type
    (``store_from_url`` takes a ``StoreSettings``) and is handed the whole. Keyword construction
    is flat: ``Settings(store_url="memory://", reconcile_workers=2)``.
    """

    @property
    def discovers_all(self) -> bool:
        """Whether the reconciler lists every batch the Gemini API key can see, tracking
        each and archiving its results (``OPSTATE_DISCOVER=all``, the default everywhere),
        or follows only what was tracked, submitted or pushed (``tracked``)."""
        return self.reconcile_discover != "tracked"

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for part in PARTS:
            values.update(part.env_values(env))
        return values


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings.from_env(os.environ)
