"""Lambda entry for the HTTP API (webhook + operations routes): wiring only.

Everything happens in ``opstate.api``; this file adds the Powertools decorators. It must stay
lean: it never imports google.genai (the reconciler's dependency) - a test asserts that.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from opstate.api import handle
from opstate.config import settings
from opstate.observability import logger, metrics, tracer

# Read the configuration during the init: a bad value fails the init, naming the variable,
# instead of failing every invocation later.
settings()


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return handle(event, context)
