"""One Lambda context stub for every test and benchmark that calls a handler or the API app."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LambdaContextStub:
    """The Lambda context attributes the functions and Powertools read.

    ``get_remaining_time_in_millis`` answers ``remaining_ms`` (set it to test a time budget).
    """

    function_name: str = "opstate-test"
    function_version: str = "$LATEST"
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:opstate-test"
    memory_limit_in_mb: int = 512
    aws_request_id: str = "00000000-0000-0000-0000-000000000000"
    log_group_name: str = "/aws/lambda/opstate-test"
    log_stream_name: str = "2026/05/10/[$LATEST]0"
    remaining_ms: int = 30_000

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms
