"""The one observability module: Powertools Logger, Metrics and Tracer, and decision logging.

Every decision is logged with its reason and counted with a ``reason`` dimension. Secrets,
signatures and whole bodies are never logged.
"""

from __future__ import annotations

import os

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from opstate.reducer import Decision

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "gemini-opstate")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "GeminiOpstate")

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
tracer = Tracer(service=SERVICE)


def count(name: str, value: float = 1, **dimensions: str) -> None:
    """Emit one metric; with dimensions it goes out as its own EMF blob."""
    if dimensions:
        with single_metric(
            name=name, unit=MetricUnit.Count, value=value, namespace=NAMESPACE
        ) as metric:
            for key, dim in dimensions.items():
                metric.add_dimension(name=key, value=dim)
    else:
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


def record_decision(decision: Decision, **context: object) -> None:
    """Log one structured line and count one metric for a decision."""
    record = decision.record
    fields = {
        "name": decision.event.name,
        "state": str(decision.event.state),
        "reason": str(decision.reason),
        "applied": decision.applied,
        "version": record.version if record is not None else 0,
        "source": decision.event.source,
        "attempts": decision.attempts,
        **context,
    }
    if decision.applied:
        logger.info("event applied", extra=fields)
        count("EventsApplied", reason=str(decision.reason))
    else:
        level = logger.warning if decision.reason == "terminal-conflict" else logger.info
        level("event dropped", extra=fields)
        count("EventsDropped", reason=str(decision.reason))
    if decision.conflicts:
        count("IngestConflicts", decision.conflicts)
