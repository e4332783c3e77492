"""Lambda entry for the HTTP API (webhook + operations routes): wiring only.

Everything happens in ``opstate.api``; this file adds the Powertools decorators. It must stay
lean: it never imports google.genai (the reconciler's dependency) - a test asserts that.

Cold start: init runs with the cyclic garbage collector paused, then freezes what it built.
Everything init allocates (modules, classes, Powertools' and botocore's tables) lives as long
as the process, so a collection during init finds next to nothing, yet the full collection that
these allocations would set off costs about a tenth of the init (benchmarks/bench_cold.py).
``gc.freeze()`` moves those objects out of the collector's reach, so later collections (the
first request builds the boto3 client) do not walk them again; garbage made after init is
collected as usual.
"""

from __future__ import annotations

import gc

gc.disable()

from typing import TYPE_CHECKING, Any  # noqa: E402

from aws_lambda_powertools.logging import correlation_paths  # noqa: E402

from opstate.api import handle  # noqa: E402
from opstate.config import settings  # noqa: E402
from opstate.observability import logger, metrics, tracer  # noqa: E402

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return handle(event, context)


gc.freeze()
gc.enable()

# Read the configuration during the init: a bad value fails the init, naming the variable,
# instead of failing every invocation later.
settings()
