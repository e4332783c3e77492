"""Logging under Lambda's advanced logging controls: what the JSON log format changes in the
process, put back where opstate must decide (issue 48).

The template (``LoggingConfig``) sends the functions' logs as JSON with ``SystemLogLevel`` WARN
by default, so that Lambda's own START/END/REPORT lines are not ingested, and with
``ApplicationLogLevel`` DEBUG when the ``LogLevel`` parameter is DEBUG, INFO otherwise. Lambda
then gives the runtime ``AWS_LAMBDA_LOG_FORMAT=JSON`` and ``AWS_LAMBDA_LOG_LEVEL=<application
level>``, and two things follow that ``settle`` undoes:

1. Powertools' Logger takes ``AWS_LAMBDA_LOG_LEVEL`` over ``POWERTOOLS_LOG_LEVEL`` (its order:
   the Lambda level first, so that it prints nothing Lambda would drop). The application level
   is never above INFO: Lambda files a JSON line without a ``level`` key - every metric
   Powertools writes (EMF) - at INFO, and above INFO it would drop the metrics the alarms read.
   So with ``LogLevel`` WARNING or ERROR Powertools would log at INFO; ``settle`` gives
   opstate's logger the stricter of the two levels: the operator's ``LogLevel`` decides again,
   and nothing is printed that Lambda drops.
2. Lambda's Python runtime (awslambdaric's ``_setup_logging``) sets the *root* logger to
   ``AWS_LAMBDA_LOG_LEVEL``; with the Text format it leaves Python's WARNING. Every library's
   INFO lines would reach the log group (httpx's ``HTTP Request: ...`` for each Gemini request,
   botocore's ``Found credentials ...``), and at DEBUG botocore's: request and response bodies,
   Secrets Manager's answers with the secrets in them. ``settle`` puts the root logger back to
   WARNING, where the Text format left it; opstate's own lines go through its own logger.

Without ``AWS_LAMBDA_LOG_LEVEL`` (the Text format, a local run, the tests) nothing is changed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

# Lambda's level names (ApplicationLogLevel) and Python's, as numbers.
_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
    "CRITICAL": logging.CRITICAL,
}


def level_of(name: str | None) -> int | None:
    """A level name (Lambda's or Python's, any case) as a number; None when unset or unknown."""
    return _LEVELS.get((name or "").strip().upper())


def settle(service: logging.Logger, environ: Mapping[str, str] = os.environ) -> None:
    """Under Lambda's log levels: the root logger back to WARNING, and ``service`` (opstate's
    Powertools logger) at ``POWERTOOLS_LOG_LEVEL`` where that is stricter than Lambda's."""
    if level_of(environ.get("AWS_LAMBDA_LOG_LEVEL")) is None:
        return
    logging.getLogger().setLevel(logging.WARNING)
    ours = level_of(environ.get("POWERTOOLS_LOG_LEVEL") or environ.get("LOG_LEVEL"))
    if ours is not None and ours > service.level:
        service.setLevel(ours)
