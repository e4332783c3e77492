"""The outcomes' settings: where results are archived and when they are due
(``opstate.outcomes``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.config.parse import (
    ConfigError,
    Part,
    bounded_int,
    given,
    read_float,
    read_str,
    scaled,
    settings_part,
)

DEFAULT_RESULTS_RETENTION_HOURS = 48.0
DEFAULT_RESULTS_WARN_HOURS = 12.0


@settings_part
class ResultsSettings(Part):
    """Outcomes: where results are archived and when they are due (``opstate.outcomes``)."""

    # s3://BUCKET/PREFIX or file:///ABS/PATH; unset: .opstate/results beside a SQLite store
    # (and no archiving on DynamoDB: the template always sets it).
    results_url: str | None = None
    # How long Gemini keeps results when a file carries no expirationTime (hours; documented:
    # generated videos and Files API files, 2 days), from the terminal time.
    results_retention_s: float = DEFAULT_RESULTS_RETENTION_HOURS * 3600.0
    # An archive still not done this close to its deadline is counted (ResultsAtRisk) and
    # logged at error level (hours).
    results_warn_s: float = DEFAULT_RESULTS_WARN_HOURS * 3600.0
    # Per-read timeout of a download (seconds) and the S3 multipart part size (MiB).
    results_http_timeout_s: float = 60.0
    results_part_mib: int = 8
    # The longest batch-output line counted (MiB); a longer one is an unreadable row.
    results_max_line_mib: int = 32
    # Failed copies are retried after this (seconds, doubled per attempt up to 1 hour).
    results_retry_s: float = 60.0
    # How long a claim on one archive holds off other archivers (seconds).
    results_lease_s: float = 900.0
    # The archiver function the reconciler invokes when it finds a due archive (AWS only).
    archiver_function: str | None = None

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        url = read_str(env, "OPSTATE_RESULTS_URL")
        if url is not None and not url.startswith(("s3://", "file:///")):
            raise ConfigError(
                f"OPSTATE_RESULTS_URL must be s3://BUCKET/PREFIX or file:///ABS/PATH, got {url!r}"
            )
        return given(
            results_url=url,
            results_retention_s=scaled(
                3600.0, read_float(env, "OPSTATE_RESULTS_RETENTION_HOURS", 1.0, 24.0 * 365)
            ),
            results_warn_s=scaled(3600.0, read_float(env, "OPSTATE_RESULTS_WARN_HOURS", 0.0, 48.0)),
            results_http_timeout_s=read_float(env, "OPSTATE_RESULTS_HTTP_TIMEOUT_SECONDS", 0.001),
            results_part_mib=bounded_int(env, "OPSTATE_RESULTS_PART_MIB", 1024),
            results_max_line_mib=bounded_int(env, "OPSTATE_RESULTS_MAX_LINE_MIB", 256, 1),
            results_retry_s=read_float(env, "OPSTATE_RESULTS_RETRY_SECONDS", 1.0, 3600.0),
            results_lease_s=read_float(env, "OPSTATE_RESULTS_LEASE_SECONDS", 1.0),
            archiver_function=read_str(env, "OPSTATE_ARCHIVER_FUNCTION"),
        )
