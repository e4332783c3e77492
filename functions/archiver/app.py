"""Lambda entry: a terminal change on the bus (or the reconciler's re-drive) -> one archive pass.

Thin wiring only; the logic is ``opstate.outcomes`` (google-genai comes from this function's
own requirements). A terminal change on the bus archives the operation it names (read by key,
no listing); any other event (the reconciler's re-drive) takes every due archive, soonest due
first. The time budget is the Lambda context's remaining time.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from opstate.config import settings
from opstate.observability import logger, metrics, tracer
from opstate.outcomes.wiring import archive_from_settings, names_of

# Read the configuration during the init: a bad value fails the init, naming the variable,
# instead of failing every invocation later.
settings()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, int]:
    result = archive_from_settings(
        settings(),
        remaining_s=lambda: context.get_remaining_time_in_millis() / 1000.0,
        names=names_of(event),
    )
    return result.as_dict()
