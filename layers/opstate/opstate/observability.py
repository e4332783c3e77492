"""The one observability module: Powertools Logger, Metrics and Tracer, and decision logging.

Every decision is logged as one structured line with its reason and counted with a ``reason``
dimension. Secrets, signatures and whole bodies are never logged: callers pass identifiers
(operation name, ``webhook-id``, event type), never payloads or headers.

Metrics (EMF, namespace ``POWERTOOLS_METRICS_NAMESPACE``, default ``GeminiOpstate``):

- ``EventsApplied`` / ``EventsDropped`` with a ``reason`` dimension (one per decision; events
  refused at normalisation as ``unsupported-event-type`` / ``unknown-state`` count as dropped);
- ``SignatureRejected`` (a webhook failed verification);
- ``IngestConflicts`` (lost conditional writes that ingest retried);
- ``IngestGaveUp`` (ingest hit its attempt bound: answered 503);
- ``StoreUnavailable`` (the store or the secrets could not be reached: answered 503).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, cast

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from opstate.reducer import Decision

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "gemini-opstate")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "GeminiOpstate")


class LazyTracer:
    """The Powertools ``Tracer``, built on first use.

    Building a ``Tracer`` imports ``aws_xray_sdk.core``, whose global recorder creates botocore
    X-Ray clients: 0.2-0.5 s of cold start. Where tracing is off (outside Lambda, under SAM
    local, ``POWERTOOLS_TRACE_DISABLED=true`` - Powertools' own rule) ``capture_lambda_handler``
    returns the handler unchanged and nothing is built; anything else delegates to the real
    ``Tracer`` (built once).
    """

    def __init__(self, service: str) -> None:
        self._service = service
        self._tracer: Tracer | None = None

    @staticmethod
    def enabled() -> bool:
        is_disabled = getattr(Tracer, "_is_tracer_disabled", None)
        return True if is_disabled is None else not is_disabled()

    def get(self) -> Tracer:
        if self._tracer is None:
            self._tracer = Tracer(service=self._service)
        return self._tracer

    def capture_lambda_handler(self, lambda_handler: Any = None, **options: Any) -> Any:
        if not self.enabled():
            return lambda_handler if lambda_handler is not None else (lambda handler: handler)
        return self.get().capture_lambda_handler(lambda_handler, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
tracer: Tracer = cast(Tracer, LazyTracer(SERVICE))

# Longest text of any caller-supplied value put in a log line (event types, names from bodies).
MAX_LOGGED_TEXT = 200


def count(name: str, value: float = 1, **dimensions: str) -> None:
    """Emit one metric; with dimensions it goes out as its own EMF blob.

    ``single_metric`` prints its blob even where Powertools' metrics are disabled
    (``POWERTOOLS_METRICS_DISABLED``, ``POWERTOOLS_DEV``), so that rule is applied here too.
    """
    if dimensions:
        if is_metrics_disabled():
            return
        with single_metric(
            name=name,
            unit=MetricUnit.Count,
            value=value,
            namespace=NAMESPACE,
            default_dimensions={"service": SERVICE},
        ) as metric:
            for key, dim in dimensions.items():
                metric.add_dimension(name=key, value=dim)
    else:
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


# Keys the stdlib refuses in ``extra`` (LogRecord attributes, e.g. ``name``): logged through
# Powertools' thread-safe appended keys instead, so the line still says ``"name": ...``.
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def _emit(level: Callable[..., None], message: str, fields: Mapping[str, object]) -> None:
    reserved = {k: v for k, v in fields.items() if k in _RESERVED}
    extra = {k: v for k, v in fields.items() if k not in _RESERVED}
    if not reserved:
        level(message, extra=extra, stacklevel=3)
        return
    logger.thread_safe_append_keys(**reserved)
    try:
        level(message, extra=extra, stacklevel=3)
    finally:
        logger.thread_safe_remove_keys(reserved)


def _clip(value: object) -> object:
    if isinstance(value, str) and len(value) > MAX_LOGGED_TEXT:
        return value[: MAX_LOGGED_TEXT - 3] + "..."
    return value


def _context(context: Mapping[str, object]) -> dict[str, object]:
    return {key: _clip(value) for key, value in context.items()}


def decision_fields(decision: Decision) -> dict[str, Any]:
    """The structured fields of one decision (what its log line carries)."""
    record = decision.record
    return {
        "name": decision.event.name,
        "state": str(decision.event.state),
        "stored_state": str(record.state) if record is not None else None,
        "reason": str(decision.reason),
        "applied": decision.applied,
        "version": record.version if record is not None else 0,
        "source": str(decision.event.source),
        "attempts": decision.attempts,
        "conflicts": decision.conflicts,
    }


def record_decision(decision: Decision, **context: object) -> None:
    """Log one structured line and count one metric for a decision.

    ``context`` adds identifiers such as ``webhook_id`` (never secrets or bodies).
    """
    fields = {**decision_fields(decision), **_context(context)}
    if decision.applied:
        _emit(logger.info, "event applied", fields)
        count("EventsApplied", reason=str(decision.reason))
    else:
        level = logger.warning if decision.reason == "terminal-conflict" else logger.info
        _emit(level, "event dropped", fields)
        count("EventsDropped", reason=str(decision.reason))
    if decision.conflicts:
        count("IngestConflicts", decision.conflicts)


def record_unsupported(reason: str, message: str, **context: object) -> None:
    """An event deliberately not turned into a state (``unsupported-event-type``,
    ``unknown-state``): a warning line and ``EventsDropped`` with that reason."""
    fields = {"reason": reason, "applied": False, "detail": _clip(message), **_context(context)}
    _emit(logger.warning, "event dropped", fields)
    count("EventsDropped", reason=reason)


def record_signature_rejected(**context: object) -> None:
    """A webhook that failed verification (which check failed is not recorded)."""
    _emit(logger.warning, "webhook signature rejected", _context(context))
    count("SignatureRejected")


def record_retry_later(kind: str, message: str, **context: object) -> None:
    """An event neither applied nor dropped: the sender is told to retry (503).

    ``kind`` is ``gave-up`` (ingest contention: ``IngestGaveUp``) or ``unavailable`` (the store
    or the secrets could not be reached: ``StoreUnavailable``).
    """
    fields = {"retry": kind, "error": message, **_context(context)}
    _emit(logger.error, "event not acknowledged", fields)
    count("IngestGaveUp" if kind == "gave-up" else "StoreUnavailable")
