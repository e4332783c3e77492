"""The AWS callbacks: Step Functions and Lambda durable calls as botocore sends them, and which
errors end a waiter, which are retried (botocore's Stubber: no network)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError
from botocore.stub import Stubber

from opstate.waiters.callbacks import AwsCallbacks
from opstate.waiters.model import Target, Waiter
from opstate.waiters.port import CallbackGoneError, CallbackRetryableError

SFN = Waiter("batches/a", Target.STEP_FUNCTIONS, "task-token-1")
DURABLE = Waiter("batches/a", Target.LAMBDA_DURABLE, "callback-1")


def clients() -> tuple[AwsCallbacks, Stubber, Stubber]:
    sfn = boto3.client("stepfunctions", region_name="us-east-1")
    lam = boto3.client("lambda", region_name="us-east-1")
    return AwsCallbacks(sfn=sfn, lambda_client=lam), Stubber(sfn), Stubber(lam)


def test_step_functions_success_and_failure_requests() -> None:
    callbacks, sfn, _ = clients()
    output = {"record": {"name": "batches/a"}, "results": None}
    sfn.add_response(
        "send_task_success",
        {},
        {"taskToken": "task-token-1", "output": json.dumps(output, separators=(",", ":"))},
    )
    sfn.add_response(
        "send_task_failure", {}, {"taskToken": "task-token-1", "error": "E" * 256, "cause": "{}"}
    )
    with sfn:
        callbacks.succeed(SFN, output)
        callbacks.fail(SFN, "E" * 300, "{}")  # error clipped to Step Functions' 256
        sfn.assert_no_pending_responses()


def test_lambda_durable_callback_requests() -> None:
    callbacks, _, lam = clients()
    lam.add_response(
        "send_durable_execution_callback_success",
        {},
        {"CallbackId": "callback-1", "Result": b'{"results":null}'},
    )
    lam.add_response(
        "send_durable_execution_callback_failure",
        {},
        {
            "CallbackId": "callback-1",
            "Error": {"ErrorType": "FAILED", "ErrorMessage": '{"state":"FAILED"}'},
        },
    )
    with lam:
        callbacks.succeed(DURABLE, {"results": None})
        callbacks.fail(DURABLE, "FAILED", '{"state":"FAILED"}')
        lam.assert_no_pending_responses()


@pytest.mark.parametrize(
    ("code", "status", "error"),
    [
        ("TaskTimedOut", 400, CallbackGoneError),
        ("TaskDoesNotExist", 400, CallbackGoneError),
        ("InvalidToken", 400, CallbackGoneError),
        ("AccessDeniedException", 400, CallbackGoneError),
        ("ThrottlingException", 400, CallbackRetryableError),
        ("InternalFailure", 500, CallbackRetryableError),
        ("Unknown", 503, CallbackRetryableError),
    ],
)
def test_step_functions_errors(code: str, status: int, error: type[Exception]) -> None:
    callbacks, sfn, _ = clients()
    sfn.add_client_error("send_task_success", service_error_code=code, http_status_code=status)
    with sfn, pytest.raises(error) as caught:
        callbacks.succeed(SFN, {})
    assert "task-token-1" not in str(caught.value)


@pytest.mark.parametrize(
    ("code", "status", "error"),
    [
        ("CallbackTimeoutException", 400, CallbackGoneError),
        ("ResourceNotFoundException", 404, CallbackGoneError),
        ("TooManyRequestsException", 429, CallbackRetryableError),
        ("ServiceException", 500, CallbackRetryableError),
    ],
)
def test_lambda_durable_errors(code: str, status: int, error: type[Exception]) -> None:
    callbacks, _, lam = clients()
    lam.add_client_error(
        "send_durable_execution_callback_failure", service_error_code=code, http_status_code=status
    )
    with lam, pytest.raises(error):
        callbacks.fail(DURABLE, "FAILED", "{}")


def test_a_connection_fault_is_retryable() -> None:
    class Down:
        def send_task_success(self, **kwargs: object) -> None:
            raise EndpointConnectionError(endpoint_url="https://states")

    with pytest.raises(CallbackRetryableError):
        AwsCallbacks(sfn=Down()).succeed(SFN, {})


def test_boto3_knows_the_durable_callback_api() -> None:
    # The reason lambdaDurableCallbackId is supported: botocore's Lambda model has the calls.
    lam = boto3.client("lambda", region_name="us-east-1")
    assert {"SendDurableExecutionCallbackSuccess", "SendDurableExecutionCallbackFailure"} <= set(
        lam.meta.service_model.operation_names
    )
