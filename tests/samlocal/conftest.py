"""Fixtures of the ``sam local`` tests (marker ``samlocal``): Docker checked once, one moto
server and one fake Gemini server on the Docker bridge's gateway, one ``sam local
start-lambda`` pointed at both, the local table / bus / consumer queue / results bucket of
events/env.json recreated (and the fake Gemini emptied) for every test, and the wall-clock
timings printed at the end of the run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest

from tests.samlocal.harness import (
    REGION,
    Invocation,
    LocalLambda,
    bridge_gateway,
    missing_prerequisite,
    require,
    sam_environment,
    start_lambda,
)
from tests.support.fake_gemini import FakeGemini, _State
from tests.support.motoserver import MotoServer, free_port, start_moto_server
from tests.support.streams import lambda_stream_records
from tests.support.template import create_table_from_template
from tests.support.webhooks import (
    LOCAL_EVENT_BUS,
    LOCAL_GEMINI_API_KEY,
    LOCAL_RESULTS_BUCKET,
    LOCAL_TABLE,
)

TIMINGS: list[tuple[str, float]] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.section("sam local timings (wall clock)")
        for label, seconds in TIMINGS:
            terminalreporter.write_line(f"{seconds:7.1f} s  {label}")


def record_timing(label: str, seconds: float) -> None:
    TIMINGS.append((label, seconds))


def record_invocation(invocation: Invocation, how: str = "sam local invoke") -> None:
    record_timing(f"{how} {invocation.function} -e {invocation.event}", invocation.seconds)


@pytest.fixture(scope="session")
def docker_gateway() -> str:
    """Docker, the base image, the SAM CLI and a current build are here (else skip / CI fail);
    the address the containers reach the host on."""
    problem = missing_prerequisite()
    require(problem is None, problem or "")
    return bridge_gateway()


@pytest.fixture(scope="session")
def local_moto(docker_gateway: str) -> Iterator[MotoServer]:
    server = start_moto_server(host=docker_gateway)
    try:
        yield server
    finally:
        server.stop()


class LocalGemini(FakeGemini):
    """The fake Gemini server of the whole run, emptied between tests: the functions'
    containers keep the address they started with."""

    def reset(self) -> None:
        with self._lock:
            self._state = _State()
            self.requests.clear()
            self._reply_headers.clear()
        self._close_submits()
        self._init_submits()


@pytest.fixture(scope="session")
def session_gemini(docker_gateway: str) -> Iterator[LocalGemini]:
    fake = LocalGemini(host=docker_gateway)
    # Any other key gets 401: success proves events/env.json's key reached the function.
    fake.api_key = LOCAL_GEMINI_API_KEY
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def local_gemini(session_gemini: LocalGemini) -> LocalGemini:
    """The run's fake Gemini server, empty."""
    session_gemini.reset()
    return session_gemini


@pytest.fixture(scope="session")
def local_lambda(
    local_moto: MotoServer, session_gemini: LocalGemini, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalLambda]:
    """One ``sam local start-lambda --warm-containers LAZY`` for the run: AWS is the moto
    server, Gemini the fake one."""
    env = sam_environment(local_moto.endpoint, {"GOOGLE_GEMINI_BASE_URL": session_gemini.base_url})
    log_path = tmp_path_factory.mktemp("start-lambda") / "start-lambda.log"
    local = start_lambda(env, free_port(), log_path)
    record_timing(
        "sam local start-lambda --warm-containers LAZY: until it answers", local.started_s
    )
    try:
        yield local
    finally:
        local.stop()


@dataclass
class LocalStack:
    """What events/env.json names, on the moto server: the table, the bus, a consumer queue,
    the archiver's results bucket."""

    endpoint: str
    gateway: str
    queue_url: str
    clients: dict[str, Any] = field(repr=False)
    table: str = LOCAL_TABLE
    bus: str = LOCAL_EVENT_BUS
    results_bucket: str = LOCAL_RESULTS_BUCKET

    def client(self, service: str) -> Any:
        return self.clients[service]

    def sam_env(self, **extra: str) -> dict[str, str]:
        return sam_environment(self.endpoint, extra)

    def get_item(self, name: str) -> dict[str, Any] | None:
        item: dict[str, Any] | None = (
            self.client("dynamodb")
            .get_item(TableName=self.table, Key={"name": {"S": name}}, ConsistentRead=True)
            .get("Item")
        )
        return item

    def stream_event(self) -> dict[str, Any]:
        """Every record on the table's stream, as Lambda hands them to the notifier."""
        ddb, streams = self.client("dynamodb"), self.client("dynamodbstreams")
        return {"Records": lambda_stream_records(ddb, streams, self.table)}

    def received(self) -> list[dict[str, Any]]:
        sqs = self.client("sqs")
        got: list[dict[str, Any]] = []
        while True:
            page = sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            messages = page.get("Messages", [])
            if not messages:
                return got
            for message in messages:
                got.append(json.loads(message["Body"]))
                sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])


@pytest.fixture
def local_stack(local_moto: MotoServer, docker_gateway: str) -> LocalStack:
    """A fresh moto (reset) holding exactly what events/env.json names."""
    local_moto.reset()
    clients: dict[str, Any] = {
        name: boto3.client(name, region_name=REGION, endpoint_url=local_moto.endpoint)
        for name in ("dynamodb", "dynamodbstreams", "events", "sqs", "s3")
    }
    create_table_from_template(clients["dynamodb"], LOCAL_TABLE)
    clients["s3"].create_bucket(Bucket=LOCAL_RESULTS_BUCKET)
    clients["events"].create_event_bus(Name=LOCAL_EVENT_BUS)
    queue_url = clients["sqs"].create_queue(QueueName="opstate-local-consumer")["QueueUrl"]
    queue_arn = clients["sqs"].get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    clients["events"].put_rule(
        Name="opstate-local-changes",
        EventBusName=LOCAL_EVENT_BUS,
        EventPattern='{"source": ["gemini-opstate"], "detail-type": ["Operation State Changed"]}',
    )
    clients["events"].put_targets(
        Rule="opstate-local-changes",
        EventBusName=LOCAL_EVENT_BUS,
        Targets=[{"Id": "consumer", "Arn": queue_arn}],
    )
    return LocalStack(local_moto.endpoint, docker_gateway, queue_url, clients)
