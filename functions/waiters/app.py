"""Lambda entry: resume waiters (bus events and the waiters table's stream) → Step Functions /
Lambda durable callbacks.

Thin wiring only; the logic is ``opstate.waiters``. A resume that must be retried raises, so
Lambda retries the invocation (the bus rule's async retries, the stream's retries) and then
sends it to the resumer's DLQ.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from opstate.config import settings
from opstate.observability import logger, metrics, tracer
from opstate.waiters.wiring import handle

# Read the configuration during the init: a bad value fails the init, naming the variable,
# instead of failing every invocation later.
settings()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return handle(event)
