"""The reconciler's settings: the Gemini API key, its pacing, schedule and marks, and Google
Cloud's discovery and credentials."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from opstate.config.google_cloud import cloud_scopes
from opstate.config.parse import (
    ConfigError,
    Part,
    given,
    read_float,
    read_int,
    read_str,
    scaled,
    settings_part,
)
from opstate.domain.names import Kind

# `opstate reconcile --once --budget`: the whole pass, Retry-After pauses included, ends by then.
DEFAULT_RECONCILE_BUDGET_S = 120.0
DEFAULT_OVERDUE_HOURS = "batch=24"


def parse_overdue(text: str | None) -> dict[Kind, float]:
    """``"batch=24,video=2"`` (hours per kind; 0 turns a kind off) as seconds per kind.

    Raises ``ValueError`` naming the bad part.
    """
    out: dict[Kind, float] = {}
    if text is None or not text.strip():
        text = DEFAULT_OVERDUE_HOURS
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"expected kind=hours, got {part!r}")
        try:
            kind = Kind(key.strip())
        except ValueError:
            kinds = ", ".join(k.value for k in Kind)
            raise ValueError(f"unknown kind {key.strip()!r} (one of {kinds})") from None
        try:
            hours = float(value)
        except ValueError:
            raise ValueError(f"hours must be a number in {part!r}") from None
        if hours < 0:
            raise ValueError(f"hours must not be negative in {part!r}")
        out[kind] = hours * 3600.0
    return {k: v for k, v in out.items() if v > 0}


def _overdue(env: Mapping[str, str]) -> str | None:
    key = "OPSTATE_RECONCILE_OVERDUE_HOURS"
    raw = read_str(env, key)
    if raw is None:
        return None
    try:
        parse_overdue(raw)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return raw


DISCOVER_CHOICES = ("all", "tracked")


def _discover(env: Mapping[str, str]) -> str | None:
    raw = read_str(env, "OPSTATE_DISCOVER")
    if raw is None:
        return None
    value = raw.strip().lower()
    if value not in DISCOVER_CHOICES:
        raise ConfigError(f"OPSTATE_DISCOVER must be all or tracked, got {raw[:40]!r}")
    return value


@settings_part
class ReconcileSettings(Part):
    """The reconciler: the Gemini API key, its pacing, schedule and marks."""

    gemini_api_key_secret_arn: str | None = None
    gemini_api_key: str | None = field(default=None, repr=False)
    reconcile_workers: int = 8
    reconcile_max_pages: int = 5
    # OPSTATE_DISCOVER: "all" (every batch the Gemini API key can list is tracked, and its
    # results archived; on AWS and locally, as before) or "tracked" (only what was tracked,
    # submitted or pushed). Said at first use locally (issue 40).
    reconcile_discover: str = "all"
    reconcile_open_limit: int = 5000
    reconcile_safety_margin_s: float = 10.0
    reconcile_http_timeout_s: float = 5.0
    reconcile_max_rps: float = 20.0
    # Read in minutes (OPSTATE_RECONCILE_..._MINUTES), kept in seconds.
    reconcile_max_interval_s: float = 30 * 60.0
    reconcile_polled_only_max_interval_s: float = 10 * 60.0
    # How often the reconciler runs (OPSTATE_RECONCILE_RATE_MINUTES, the template's
    # ReconcileRateMinutes; 0: not known). A poll whose next due time comes before the next
    # run is then not written (reconcile.poll_writer).
    reconcile_rate_s: float = 0.0
    reconcile_lost_after_runs: int = 3
    # Read in hours (OPSTATE_RECONCILE_LOST_AFTER_HOURS), kept in seconds.
    reconcile_lost_after_s: float = 24 * 3600.0
    # "kind=hours,..." (parsed by parse_overdue)
    reconcile_overdue_hours: str = DEFAULT_OVERDUE_HOURS
    # Google Cloud (docs/google-cloud.md): discovery scopes (PROJECT, LOCATION), the rate
    # limit of Cloud requests (separate from the Gemini API's), and the credentials: a
    # Secrets Manager secret holding a google-auth JSON (external_account or service_account)
    # or, locally, google-auth's own GOOGLE_APPLICATION_CREDENTIALS file.
    google_cloud_scopes: tuple[tuple[str, str], ...] = ()
    google_cloud_max_rps: float = 10.0
    google_credentials_secret_arn: str | None = None
    google_application_credentials: str | None = None
    # Where a local credentials file's "file" source may read (unset: nowhere; security.md).
    google_subject_token_dir: str | None = None

    @property
    def google_cloud_configured(self) -> bool:
        """Whether Google Cloud is set up at all (else the reconciler never calls it)."""
        return bool(
            self.google_cloud_scopes
            or self.google_credentials_secret_arn
            or self.google_application_credentials
        )

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        return given(
            gemini_api_key_secret_arn=read_str(env, "OPSTATE_GEMINI_API_KEY_SECRET_ARN"),
            gemini_api_key=read_str(env, "GEMINI_API_KEY"),
            reconcile_workers=read_int(env, "OPSTATE_RECONCILE_WORKERS", minimum=1),
            reconcile_max_pages=read_int(env, "OPSTATE_RECONCILE_MAX_PAGES", minimum=0),
            reconcile_discover=_discover(env),
            reconcile_open_limit=read_int(env, "OPSTATE_RECONCILE_OPEN_LIMIT", minimum=1),
            reconcile_safety_margin_s=read_float(env, "OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS"),
            reconcile_http_timeout_s=read_float(
                env, "OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS", minimum=0.001
            ),
            reconcile_max_rps=read_float(env, "OPSTATE_RECONCILE_MAX_RPS"),
            reconcile_max_interval_s=scaled(
                60.0, read_float(env, "OPSTATE_RECONCILE_MAX_INTERVAL_MINUTES", minimum=1.0)
            ),
            reconcile_polled_only_max_interval_s=scaled(
                60.0,
                read_float(env, "OPSTATE_RECONCILE_POLLED_ONLY_MAX_INTERVAL_MINUTES", minimum=1.0),
            ),
            reconcile_rate_s=scaled(
                60.0, read_float(env, "OPSTATE_RECONCILE_RATE_MINUTES", minimum=0.0)
            ),
            reconcile_lost_after_runs=read_int(env, "OPSTATE_RECONCILE_LOST_AFTER_RUNS", minimum=1),
            reconcile_lost_after_s=scaled(
                3600.0, read_float(env, "OPSTATE_RECONCILE_LOST_AFTER_HOURS")
            ),
            reconcile_overdue_hours=_overdue(env),
            google_cloud_scopes=cloud_scopes(env),
            google_cloud_max_rps=read_float(env, "OPSTATE_GOOGLE_CLOUD_MAX_RPS"),
            google_credentials_secret_arn=read_str(env, "OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN"),
            google_application_credentials=read_str(env, "GOOGLE_APPLICATION_CREDENTIALS"),
            google_subject_token_dir=read_str(env, "OPSTATE_GOOGLE_SUBJECT_TOKEN_DIR"),
        )
