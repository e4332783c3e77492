"""Lambda entry: a terminal change on the bus (or the reconciler's re-drive) -> one archive
pass, then one retry pass. A submit request (``{"submit": {...}}``) is refused: submitting is
the submit function's (functions/submit, its own role; stack output ``SubmitFunctionName``).

Thin wiring only; the logic is ``opstate.outcomes`` and ``opstate.retry`` (google-genai comes
from this function's own requirements). A terminal change on the bus archives the operation it
names (read by key, no listing) and takes the lineage it belongs to one step further; any other
event (the reconciler's re-drive) takes every due archive, soonest due first, then every due
retry. The time budget is the Lambda context's remaining time.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from opstate.config import settings
from opstate.observability import logger, metrics, tracer
from opstate.outcomes.wiring import archive_from_settings, names_of
from opstate.retry.wiring import SubmitRefusedError, retry_from_settings, roots_of

# Read the configuration during the init: a bad value fails the init, naming the variable,
# instead of failing every invocation later.
settings()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if isinstance(event, dict) and "submit" in event:
        raise SubmitRefusedError(
            "the archiver submits nothing: invoke the submit function (stack output "
            "SubmitFunctionName) with this request"
        )

    def remaining_s() -> float:
        return context.get_remaining_time_in_millis() / 1000.0

    names = names_of(event)
    result = archive_from_settings(settings(), remaining_s=remaining_s, names=names)
    if names is None:
        retried = retry_from_settings(settings(), remaining_s)
    else:
        from opstate.store import store_from_url

        store = store_from_url(settings().store_url, settings())
        try:
            roots = roots_of(store, names)
            if not roots:  # not part of a lineage: no client, no pass
                return {**result.as_dict(), "retry": None}
            retried = retry_from_settings(settings(), remaining_s, store=store, names=roots)
        finally:
            store.close()
    return {**result.as_dict(), "retry": retried.as_dict()}
