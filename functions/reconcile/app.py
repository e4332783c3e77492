"""Lambda entry: EventBridge Scheduler -> one reconcile run.

Thin wiring only; the logic is ``opstate.reconcile``, put together by
``opstate.wiring.reconcile`` (google-genai comes from this function's own requirements). The
time budget is the Lambda context's remaining time.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from opstate.config import settings
from opstate.observability import logger, metrics, tracer
from opstate.wiring.reconcile import run_from_settings

# Read the configuration during the init: a bad value fails the init, naming the variable,
# instead of failing every invocation later.
settings()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, int | bool]:
    result = run_from_settings(settings(), remaining_ms=context.get_remaining_time_in_millis)
    return result.as_dict()
