"""E2E fixtures: AWS resources on the moto server, and the built functions behind the RIE."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.e2e.harness import (
    BUILT_TEMPLATE,
    REGION,
    RIE_PYTHON,
    BuiltTemplate,
    LambdaProcess,
    require,
    rie_binary,
    stale_build_files,
    start_function,
    subscribe,
)
from tests.support.motoserver import MotoServer
from tests.support.template import create_table_from_template
from tests.support.webhooks import TEST_SECRET

STACK_NAME = "gemini-opstate-e2e"
ACCOUNT_ID = "123456789012"
GEMINI_TEST_KEY = "e2e-test-gemini-api-key"


@pytest.fixture(scope="session")
def built_template() -> BuiltTemplate:
    """The sam build output, checked to exist, to be current, and to be runnable here."""
    require(
        rie_binary() is not None,
        "aws-lambda-rie not found in .tools-venv (aws-sam-cli): run `make tools`",
    )
    require(RIE_PYTHON.is_file(), ".rie-venv (awslambdaric) is missing: run `make rie-venv`")
    require(BUILT_TEMPLATE.is_file(), ".aws-sam/build is missing: run `make build`")
    stale = stale_build_files()
    require(
        not stale,
        "the sam build output is older than the sources (run `make build`): "
        + ", ".join(stale[:5]),
    )
    return BuiltTemplate.load()


@dataclass
class Stack:
    """The test's stand-ins for the stack's resources, on the moto server."""

    endpoint: str
    table: str
    bus: str
    queue_url: str
    quarantine_queue_url: str
    webhook_secret_arn: str
    gemini_key_secret_arn: str
    google_credentials_secret_arn: str
    clients: dict[str, Any] = field(repr=False)
    results_bucket: str = ""
    waiters_table: str = ""

    def client(self, service: str) -> Any:
        return self.clients[service]

    @property
    def refs(self) -> dict[str, str]:
        """How the template's Refs resolve in this test (logical id -> value)."""
        return {
            "OperationsTable": self.table,
            "WaitersTable": self.waiters_table,
            "EventBus": self.bus,
            "WebhookQuarantineQueue": self.quarantine_queue_url,  # an SQS queue's Ref is its URL
            "WebhookSigningSecret": self.webhook_secret_arn,
            "GeminiApiKeySecret": self.gemini_key_secret_arn,
            "GoogleCredentialsSecret": self.google_credentials_secret_arn,
            "ResultsBucket": self.results_bucket,
            # The reconciler's re-drive target (moto has no such function: the invoke fails
            # and is logged, which the re-drive tolerates by design).
            "ArchiverFunction": f"{STACK_NAME}-archiver",
            # Deployed with every metric: the tests check each one the dashboard draws (at the
            # defaults only the core set is sent: tests/integration/test_bench_aws_cost_quick.py).
            "DetailedMetrics": "true",
            # Discovery of every listed batch (the default is `tracked`, issue 48): the
            # scheduled-reconcile test holds what a run discovers.
            "Discover": "all",
            "AWS::StackName": STACK_NAME,
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT_ID,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
        }


@pytest.fixture
def stack(moto_server: MotoServer) -> Stack:
    suffix = uuid.uuid4().hex[:8]
    clients: dict[str, Any] = {
        name: boto3.client(name, region_name=REGION, endpoint_url=moto_server.endpoint)
        for name in ("dynamodb", "dynamodbstreams", "events", "sqs", "secretsmanager", "s3")
    }
    results_bucket = f"e2e-results-{suffix}"
    clients["s3"].create_bucket(Bucket=results_bucket)
    table = f"e2e-ops-{suffix}"
    create_table_from_template(clients["dynamodb"], table)
    waiters_table = f"e2e-waiters-{suffix}"
    create_table_from_template(clients["dynamodb"], waiters_table, "WaitersTable")
    bus = f"e2e-bus-{suffix}"
    clients["events"].create_event_bus(Name=bus)
    queue_url = clients["sqs"].create_queue(QueueName=f"e2e-consumer-{suffix}")["QueueUrl"]
    quarantine_url = clients["sqs"].create_queue(QueueName=f"e2e-quarantine-{suffix}")["QueueUrl"]
    subscribe(
        clients,
        bus=bus,
        queue_url=queue_url,
        rule=f"e2e-state-changes-{suffix}",
        detail_types=["Operation State Changed"],
    )
    # The secrets as an operator fills them (docs/deploy.md): put-secret-value on the stack's.
    webhook_secret = clients["secretsmanager"].create_secret(
        Name=f"e2e-webhook-signing-{suffix}", Description="e2e"
    )["ARN"]
    clients["secretsmanager"].put_secret_value(SecretId=webhook_secret, SecretString=TEST_SECRET)
    gemini_secret = clients["secretsmanager"].create_secret(
        Name=f"e2e-gemini-key-{suffix}", Description="e2e"
    )["ARN"]
    clients["secretsmanager"].put_secret_value(SecretId=gemini_secret, SecretString=GEMINI_TEST_KEY)
    # Left empty, as the template creates it: a deployment without Google Cloud never reads it.
    google_secret = clients["secretsmanager"].create_secret(
        Name=f"e2e-google-credentials-{suffix}", Description="e2e"
    )["ARN"]
    return Stack(
        endpoint=moto_server.endpoint,
        table=table,
        bus=bus,
        queue_url=queue_url,
        quarantine_queue_url=quarantine_url,
        webhook_secret_arn=webhook_secret,
        gemini_key_secret_arn=gemini_secret,
        google_credentials_secret_arn=google_secret,
        clients=clients,
        results_bucket=results_bucket,
        waiters_table=waiters_table,
    )


StartFunction = Callable[..., LambdaProcess]


@pytest.fixture
def start(built_template: BuiltTemplate, stack: Stack, tmp_path: Path) -> Iterator[StartFunction]:
    """Start a built function (``start("WebhookFunction", overrides={...})``); every process
    started is stopped when the test ends, its log kept under ``tmp_path``."""
    started: list[LambdaProcess] = []

    def _start(logical_id: str, overrides: dict[str, str] | None = None) -> LambdaProcess:
        proc = start_function(
            built_template,
            logical_id,
            refs=stack.refs,
            aws_endpoint=stack.endpoint,
            log_dir=tmp_path,
            overrides=overrides,
        )
        started.append(proc)
        return proc

    try:
        yield _start
    finally:
        for proc in started:
            proc.stop()
