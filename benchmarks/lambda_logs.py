r"""The lines Lambda itself writes to a function's log group, sized (issue 48).

Used by ``bench_aws_cost.py``: CloudWatch Logs bills every byte ingested, and besides what a
function prints, Lambda writes its own "system" (platform) lines for every invocation and every
cold start. Pure: a function's logging settings and an invocation's figures in, the lines and
their bytes out. Tested in tests/unit/test_lambda_logs.py.

What is sent depends on the function's ``LoggingConfig`` (read through the project's search
tool from AWS's Lambda developer guide, 2026-12):

- ``LogFormat: Text`` (the default): every line, whatever the levels; "To use log-level
  filtering, your function must be configured to use the JSON log format" (*Log-level
  filtering*). The shapes, from *Log and monitor Python Lambda functions*' example output
  (fields separated by tabs, shown here as spaces; ``\`` marks where a quoted line is wrapped
  here; the ``XRAY`` part only with active tracing, ``Init Duration`` only on a cold start)::

      START RequestId: 8f507cfc-xmpl-4697-b07a-ac58fc914c95 Version: $LATEST
      END RequestId: 8f507cfc-xmpl-4697-b07a-ac58fc914c95
      REPORT RequestId: 8f507cfc-xmpl-4697-b07a-ac58fc914c95  Duration: 15.74 ms \
        Billed Duration: 147 ms Memory Size: 128 MB Max Memory Used: 56 MB \
        Init Duration: 130.49 ms
      XRAY TraceId: 1-5e34a614-10bdxmplf1fb44f07bc535a1   SegmentId: 07f5xmpl2d...

  and once per cold start (a ``sam logs`` capture of a Python function)::

      INIT_START Runtime Version: python:3.11.v33  Runtime Version ARN: \
        arn:aws:lambda:us-east-1::runtime:66487d2b...

- ``LogFormat: JSON``: the platform events as JSON objects, filtered by ``SystemLogLevel``
  (DEBUG, INFO, WARN; default INFO): "By default, Lambda sets the system log level to INFO.
  With this setting, Lambda automatically sends "start" and "report" log messages"; at WARN
  neither is sent. Modelled at INFO: ``platform.start`` and ``platform.report`` per invocation
  and ``platform.initStart`` per cold start, with the record fields of the *Telemetry API
  Event schema reference* (``requestId``, ``version``; ``metrics`` ``durationMs``,
  ``billedDurationMs``, ``memorySizeMB``, ``maxMemoryUsedMB``, ``initDurationMs``; ``tracing``;
  ``status``; ``initializationType``, ``phase``, ``runtimeVersion``, ``runtimeVersionArn``).
  DEBUG (more events than INFO's) is not modelled.

Assumed where a figure is not known: ``Max Memory Used`` 3 digits, a two-digit runtime
release, ``Sampled: true``; each changes a line by a byte or two. Billed Duration counts the
INIT phase on a cold start, as the example above does (15.74 + 130.49 ms billed 147 ms).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

LOG_FORMATS = ("Text", "JSON")
SYSTEM_LEVELS = ("DEBUG", "INFO", "WARN")
# Lambda's ApplicationLogLevel values and the runtime's AWS_LAMBDA_LOG_LEVEL.
APPLICATION_LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL")

REQUEST_ID = "8f507cfc-0000-4697-b07a-ac58fc914c95"  # 36 characters, as every request id
TRACE_ID = "1-5e34a614-10bd0000f1fb44f07bc535a1"  # X-Ray: 1-<8 hex>-<24 hex>
SEGMENT_ID = "07f5000a2d1f6f85"  # 16 hex
RUNTIME_VERSION = "python:3.13.v31"
RUNTIME_ARN = "arn:aws:lambda:us-east-1::runtime:" + "0" * 64
MAX_MEMORY_USED_MB = 120
TIME = "2026-09-24T00:00:00.000Z"


@dataclass(frozen=True)
class LogSettings:
    """A function's logging as Lambda applies it: ``LoggingConfig`` and ``Tracing``."""

    log_format: str = "Text"
    system_level: str = "INFO"
    application_level: str = "INFO"
    tracing: bool = False

    def __post_init__(self) -> None:
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"LogFormat {self.log_format!r}: one of {LOG_FORMATS}")
        if self.system_level not in SYSTEM_LEVELS:
            raise ValueError(f"SystemLogLevel {self.system_level!r}: one of {SYSTEM_LEVELS}")
        if self.application_level not in APPLICATION_LEVELS:
            raise ValueError(f"ApplicationLogLevel {self.application_level!r}")


def settings_of(logging_config: Mapping[str, str] | None, tracing: str | None) -> LogSettings:
    """The settings of a function from its (resolved) ``LoggingConfig`` and ``Tracing``; what
    is left out is Lambda's default (Text; INFO and INFO once JSON; no tracing)."""
    config = dict(logging_config or {})
    return LogSettings(
        log_format=config.get("LogFormat", "Text"),
        system_level=config.get("SystemLogLevel", "INFO"),
        application_level=config.get("ApplicationLogLevel", "INFO"),
        tracing=tracing == "Active",
    )


def runtime_environment(settings: LogSettings) -> dict[str, str]:
    """The variables Lambda gives the runtime for these settings: with JSON,
    ``AWS_LAMBDA_LOG_FORMAT`` and ``AWS_LAMBDA_LOG_LEVEL`` (the application level), which
    Lambda's Python runtime and Powertools read; with Text, none."""
    if settings.log_format != "JSON":
        return {}
    return {"AWS_LAMBDA_LOG_FORMAT": "JSON", "AWS_LAMBDA_LOG_LEVEL": settings.application_level}


@dataclass(frozen=True)
class Invocation:
    """One invocation as Lambda reports it: its duration, the function's memory and, on a cold
    start, the INIT phase's duration."""

    duration_ms: float
    memory_mb: int
    init_ms: float | None = None


def billed_ms(invocation: Invocation) -> int:
    return math.ceil(invocation.duration_ms + (invocation.init_ms or 0.0))


def _compact(doc: object) -> str:
    return json.dumps(doc, separators=(",", ":")) + "\n"


def _tracing() -> dict[str, str]:
    return {
        "spanId": SEGMENT_ID,
        "type": "X-Amzn-Trace-Id",
        "value": f"Root={TRACE_ID};Parent={SEGMENT_ID};Sampled=1",
    }


def _text_lines(settings: LogSettings, invocation: Invocation) -> list[str]:
    report = (
        f"REPORT RequestId: {REQUEST_ID}\tDuration: {invocation.duration_ms:.2f} ms\t"
        f"Billed Duration: {billed_ms(invocation)} ms\tMemory Size: {invocation.memory_mb} MB\t"
        f"Max Memory Used: {MAX_MEMORY_USED_MB} MB\t"
    )
    if invocation.init_ms is not None:
        report += f"Init Duration: {invocation.init_ms:.2f} ms\t"
    if settings.tracing:
        report += f"\nXRAY TraceId: {TRACE_ID}\tSegmentId: {SEGMENT_ID}\tSampled: true\t"
    return [
        f"START RequestId: {REQUEST_ID} Version: $LATEST\n",
        f"END RequestId: {REQUEST_ID}\n",
        report + "\n",
    ]


def _json_lines(settings: LogSettings, invocation: Invocation) -> list[str]:
    start: dict[str, object] = {"requestId": REQUEST_ID, "version": "$LATEST"}
    metrics: dict[str, object] = {
        "durationMs": round(invocation.duration_ms, 2),
        "billedDurationMs": billed_ms(invocation),
        "memorySizeMB": invocation.memory_mb,
        "maxMemoryUsedMB": MAX_MEMORY_USED_MB,
    }
    if invocation.init_ms is not None:
        metrics["initDurationMs"] = round(invocation.init_ms, 2)
    report: dict[str, object] = {"requestId": REQUEST_ID, "metrics": metrics}
    if settings.tracing:
        start["tracing"] = report["tracing"] = _tracing()
    report["status"] = "success"
    return [
        _compact({"time": TIME, "type": "platform.start", "record": start}),
        _compact({"time": TIME, "type": "platform.report", "record": report}),
    ]


def _check_modelled(settings: LogSettings) -> None:
    if settings.log_format == "JSON" and settings.system_level == "DEBUG":
        raise ValueError("SystemLogLevel DEBUG (the runtimeDone events) is not modelled")


def invocation_lines(settings: LogSettings, invocation: Invocation) -> list[str]:
    """The platform lines Lambda sends for one invocation (each ending in a newline)."""
    _check_modelled(settings)
    if settings.log_format == "Text":
        return _text_lines(settings, invocation)
    if settings.system_level == "WARN":
        return []
    return _json_lines(settings, invocation)


def cold_start_lines(settings: LogSettings, function_name: str) -> list[str]:
    """The platform lines of one cold start, besides its first invocation's."""
    _check_modelled(settings)
    if settings.log_format == "Text":
        return [
            f"INIT_START Runtime Version: {RUNTIME_VERSION}\tRuntime Version ARN: {RUNTIME_ARN}\n"
        ]
    if settings.system_level == "WARN":
        return []
    record = {
        "initializationType": "on-demand",
        "phase": "init",
        "runtimeVersion": RUNTIME_VERSION,
        "runtimeVersionArn": RUNTIME_ARN,
        "functionName": function_name,
        "functionVersion": "$LATEST",
    }
    return [_compact({"time": TIME, "type": "platform.initStart", "record": record})]


def size(lines: list[str]) -> int:
    """Bytes of lines as CloudWatch Logs ingests them (UTF-8)."""
    return sum(len(line.encode()) for line in lines)
