"""Lambda entry of the submit function: ``{"submit": {...}}`` -> one batch submitted through
opstate (its input kept, uploaded, created at Gemini and tracked with its policy).

Thin wiring only; the logic is ``opstate.retry.wiring.submit_event`` (google-genai comes from
this function's own requirements). It has its own role (docs/security.md, "Acting"): it reads
inputs only under ``incoming/`` of the results bucket, which ``submit_event`` checks too, and
writes only the kept inputs. A request it refuses raises ``SubmitRefusedError`` (nothing
created); a Gemini fault fails the invocation (invoke again: the submit id makes it safe).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from opstate.config import settings
from opstate.observability import logger, metrics, tracer
from opstate.retry.wiring import submit_request

# Read the configuration during the init: a bad value fails the init, naming the variable,
# instead of failing every invocation later.
settings()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return {"submitted": submit_request(settings(), event)}
