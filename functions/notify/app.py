"""Lambda entry: DynamoDB Streams (the operations table) → EventBridge custom bus.

Thin wiring only; the logic is ``opstate.notify``. The event source mapping must enable
``ReportBatchItemFailures``: the returned ``batchItemFailures`` name exactly the records that
were not published.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from opstate.config import settings
from opstate.notify import handle
from opstate.observability import logger, metrics, tracer

# Read the configuration during the init: a bad value fails the init, naming the variable,
# instead of failing every invocation later.
settings()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return dict(handle(event, context))
