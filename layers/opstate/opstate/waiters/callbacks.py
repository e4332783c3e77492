"""``Callbacks`` on AWS: Step Functions task tokens and Lambda durable callback ids (boto3).

Error mapping (both services):

- the waiter can never be resumed → ``CallbackGoneError``: Step Functions ``TaskTimedOut``,
  ``TaskDoesNotExist``, ``InvalidToken``; Lambda ``CallbackTimeoutException``,
  ``ResourceNotFoundException``, ``InvalidParameterValueException``; and any other 4xx
  (``AccessDenied`` for a state machine the resumer may not resume, ``InvalidOutput``...), which
  no retry can change;
- throttling, 5xx, timeouts and connection faults → ``CallbackRetryableError``.

Tokens go to the service and nowhere else: an error message is never logged with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from opstate.domain.strict_json import dumps
from opstate.waiters.model import MAX_ERROR_LENGTH, Target, Waiter
from opstate.waiters.port import CallbackGoneError, CallbackRetryableError

CLIENT_CONFIG = Config(
    retries={"mode": "standard", "total_max_attempts": 2}, connect_timeout=2, read_timeout=5
)
GONE_CODES: Final = frozenset(
    {
        "TaskTimedOut",
        "TaskDoesNotExist",
        "InvalidToken",
        "CallbackTimeoutException",
        "ResourceNotFoundException",
        "InvalidParameterValueException",
    }
)
RETRY_CODES: Final = frozenset(
    {
        "ThrottlingException",
        "Throttling",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ServiceException",
        "ServiceUnavailable",
        "InternalFailure",
        "InternalServerError",
        "RequestTimeout",
        "RequestTimeoutException",
        "KMSThrottlingException",
    }
)


def classify(exc: ClientError | BotoCoreError) -> Exception:
    """The port's error for a boto3 error (never carrying the request, hence no token)."""
    if isinstance(exc, BotoCoreError):
        return CallbackRetryableError(type(exc).__name__)
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code in GONE_CODES:
        return CallbackGoneError(code)
    if code in RETRY_CODES or status >= 500 or status == 429:
        return CallbackRetryableError(code or str(status))
    return CallbackGoneError(code or str(status))


class AwsCallbacks:
    """Resumes Step Functions tasks and Lambda durable callbacks; clients built on first use
    (boto3 honours ``AWS_ENDPOINT_URL_SFN`` / ``AWS_ENDPOINT_URL_LAMBDA``)."""

    def __init__(self, *, sfn: Any = None, lambda_client: Any = None) -> None:
        self._sfn = sfn
        self._lambda = lambda_client

    @property
    def sfn(self) -> Any:
        if self._sfn is None:
            self._sfn = boto3.client("stepfunctions", config=CLIENT_CONFIG)
        return self._sfn

    @property
    def lambda_client(self) -> Any:
        if self._lambda is None:
            self._lambda = boto3.client("lambda", config=CLIENT_CONFIG)
        return self._lambda

    def succeed(self, waiter: Waiter, output: Mapping[str, Any]) -> None:
        text = dumps(output, compact=True)
        try:
            if waiter.target is Target.STEP_FUNCTIONS:
                self.sfn.send_task_success(taskToken=waiter.token, output=text)
            else:
                self.lambda_client.send_durable_execution_callback_success(
                    CallbackId=waiter.token, Result=text.encode("utf-8")
                )
        except (ClientError, BotoCoreError) as exc:
            raise classify(exc) from None

    def fail(self, waiter: Waiter, error: str, cause: str) -> None:
        error = error[:MAX_ERROR_LENGTH]
        try:
            if waiter.target is Target.STEP_FUNCTIONS:
                self.sfn.send_task_failure(taskToken=waiter.token, error=error, cause=cause)
            else:
                self.lambda_client.send_durable_execution_callback_failure(
                    CallbackId=waiter.token, Error={"ErrorType": error, "ErrorMessage": cause}
                )
        except (ClientError, BotoCoreError) as exc:
            raise classify(exc) from None
