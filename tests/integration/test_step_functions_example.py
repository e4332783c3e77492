"""examples/step-functions: the state machine's shape, and its waiter path run for real.

moto executes the example's ASL (``execute_state_machine``: moto's Step Functions interpreter,
which really issues task tokens and really accepts ``SendTaskSuccess`` / ``SendTaskFailure``).
moto cannot run a Lambda without Docker images, so its Lambda backend hands each invocation to
the example's own function code, in process, with the very payload Step Functions built (the
task token included). That code registers the waiter over HTTP with the operations API, served
here by opstate's own local HTTP server with a bearer token; the resumer (``opstate.waiters``,
the AWS callbacks on moto's Step Functions) answers the token. Submitting the batch is the one
part replaced: ``submit_batch`` returns a name instead of calling Gemini.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest

from opstate.api import create_app, require_bearer_token
from opstate.config import Settings
from opstate.local.http_server import ApiGatewayApp, LocalHTTPServer
from opstate.signatures import StaticSecretsVerifier
from opstate.store import MemoryStore
from opstate.waiters.callbacks import AwsCallbacks
from opstate.waiters.enabled import ALL_TARGETS
from opstate.waiters.memory import MemoryWaiterStore
from opstate.waiters.run import Registrar, Resumer, store_status
from opstate.waiters.wiring import handle
from tests.support.webhooks import TEST_SECRET

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "step-functions"
DEFINITION = json.loads((EXAMPLE / "statemachine.asl.json").read_text(encoding="utf-8"))
API_TOKEN = "example-token-" + "e" * 40
NAME = "batches/example-1"


def load_function() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "example_batch_function", EXAMPLE / "batch_function" / "app.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the definition's shape -------------------------------------------------------------------


def test_the_definition_submits_waits_for_a_task_token_and_continues() -> None:
    states = DEFINITION["States"]
    assert DEFINITION["StartAt"] == "SubmitBatch"
    for state in states.values():  # every transition lands on a state; every path ends
        for target in [state.get("Next"), *(c["Next"] for c in state.get("Catch", []))]:
            assert target is None or target in states
        assert "Next" in state or state.get("End") or state["Type"] in ("Fail", "Succeed")
    submit, wait, use = states["SubmitBatch"], states["WaitForBatch"], states["UseResults"]
    assert (
        submit["Resource"] == "arn:aws:states:::lambda:invoke" and submit["Next"] == "WaitForBatch"
    )
    assert wait["Resource"] == "arn:aws:states:::lambda:invoke.waitForTaskToken"
    payload = wait["Parameters"]["Payload"]
    assert payload["taskToken.$"] == "$$.Task.Token" and payload["name.$"] == "$.batch.name"
    assert payload["action"] == "wait" and "when.$" in payload
    assert 0 < wait["TimeoutSeconds"] <= 366 * 86400  # a waiter is never kept longer
    # A failure resumed by gemini-opstate (FAILED, LOST...) is caught, never retried.
    retried = {e for r in wait["Retry"] for e in r["ErrorEquals"]}
    assert "States.ALL" not in retried and not retried & {"FAILED", "CANCELLED", "LOST"}
    assert wait["Catch"][0]["ErrorEquals"] == ["States.ALL"]
    assert states[wait["Catch"][0]["Next"]]["Type"] == "Fail"
    assert use["Parameters"]["state.$"] == "$.waited.record.state"
    assert use["Parameters"]["results.$"] == "$.waited.results"
    assert (
        submit["Parameters"]["FunctionName"]
        == wait["Parameters"]["FunctionName"]
        == "${BatchFunctionArn}"
    )


def test_the_function_registers_the_token_as_a_waiter(monkeypatch: pytest.MonkeyPatch) -> None:
    function = load_function()
    sent: list[tuple[str, Any]] = []
    monkeypatch.setattr(
        function, "put_operation", lambda name, body: sent.append((name, body)) or {}
    )
    function.handler({"action": "wait", "name": NAME, "taskToken": "tok", "when": None})
    assert sent == [(NAME, {"waiter": {"stepFunctionsTaskToken": "tok", "when": "terminal"}})]
    with pytest.raises(ValueError, match="unknown action"):
        function.handler({"action": "other"})


# -- the waiter path on moto --------------------------------------------------------------------


class Rig:
    def __init__(
        self,
        sfn: Any,
        arn: str,
        store: MemoryStore,
        waiters: MemoryWaiterStore,
        resumer: Resumer,
        app: Any,
    ) -> None:
        self.sfn, self.arn, self.store, self.waiters, self.resumer, self.app = (
            sfn,
            arn,
            store,
            waiters,
            resumer,
            app,
        )

    def start(self, when: str) -> str:
        execution = self.sfn.start_execution(
            stateMachineArn=self.arn,
            input=json.dumps({"model": "models/gemini-2.5-flash", "requests": [], "when": when}),
        )
        return str(execution["executionArn"])

    def wait_registered(self, execution: str) -> None:
        deadline = time.monotonic() + 20
        while not self.waiters.list(NAME):
            assert time.monotonic() < deadline, self.sfn.describe_execution(executionArn=execution)
            time.sleep(0.05)

    def report(self, state: str, **details: Any) -> None:
        from tests.support.webhooks import operation_event

        body = json.dumps(
            {"state": state, "updateTime": "2026-06-01T00:00:00Z", "details": details}
        ).encode()
        event = operation_event("PUT", NAME, body)
        event["headers"]["authorization"] = f"Bearer {API_TOKEN}"
        answer = self.app.resolve(event, None)
        assert answer["statusCode"] == 200, answer

    def finished(self, execution: str) -> dict[str, Any]:
        deadline = time.monotonic() + 20
        while True:
            described: dict[str, Any] = self.sfn.describe_execution(executionArn=execution)
            if described["status"] != "RUNNING":
                return described
            assert time.monotonic() < deadline, "the execution was not resumed"
            time.sleep(0.05)


def _rig(archiving: bool, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    from moto import mock_aws
    from moto.awslambda_simple.models import LambdaSimpleBackend

    function = load_function()
    monkeypatch.setattr(function, "submit_batch", lambda model, requests: NAME)

    def invoke(self: Any, function_name: str, qualifier: Any, body: Any, *args: Any) -> bytes:
        return json.dumps(function.handler(json.loads(body))).encode()

    monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)
    config: Any = {
        "stepfunctions": {"execute_state_machine": True},
        "lambda": {"use_docker": False},
    }
    with mock_aws(config=config):
        store, waiters = MemoryStore(), MemoryWaiterStore()
        sfn = boto3.client("stepfunctions", region_name="us-east-1")
        # The shape of the outcomes work's results_json (opstate results --json).
        archive = {
            "name": NAME,
            "status": "archived",
            "objects": [{"location": "s3://results-bucket/batches/example-1/out.jsonl"}],
        }
        resumer = Resumer(
            waiters,
            store_status(store, (lambda n: archive) if archiving else None),
            AwsCallbacks(sfn=sfn),
            targets=ALL_TARGETS,  # the stack's WaiterStateMachineArns names this machine
        )
        app = create_app(
            store=store,
            verifier=StaticSecretsVerifier([TEST_SECRET]),
            settings=Settings(),
            operations_auth=require_bearer_token(API_TOKEN),
            registrar=Registrar(waiters, limit=3, archiving=archiving, targets=ALL_TARGETS),
            on_waiter=resumer.resume,
        )
        server = LocalHTTPServer("127.0.0.1", 0, ApiGatewayApp(app.resolve, say=lambda line: None))
        server.start()
        monkeypatch.setenv("OPSTATE_API_URL", f"http://127.0.0.1:{server.port}/operations/")
        monkeypatch.setenv("OPSTATE_API_TOKEN", API_TOKEN)
        try:
            iam = boto3.client("iam", region_name="us-east-1")
            role = iam.create_role(RoleName="example", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
            lam = boto3.client("lambda", region_name="us-east-1")
            fn = lam.create_function(
                FunctionName="example-batch",
                Runtime="python3.13",
                Role=role,
                Handler="app.handler",
                Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18},
            )["FunctionArn"]
            definition = json.dumps(DEFINITION).replace("${BatchFunctionArn}", fn)
            arn = sfn.create_state_machine(name="example", definition=definition, roleArn=role)[
                "stateMachineArn"
            ]
            yield Rig(sfn, arn, store, waiters, resumer, app)
        finally:
            server.shutdown()


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    yield from _rig(False, monkeypatch)


@pytest.fixture
def archiving_rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    yield from _rig(True, monkeypatch)


def bus_event(detail_type: str = "Operation State Changed") -> dict[str, Any]:
    return {
        "source": "gemini-opstate",
        "detail-type": detail_type,
        "detail": {"name": NAME, "state": "SUCCEEDED"},
    }


def test_a_running_job_resumes_the_execution_with_its_record_when_it_ends(rig: Rig) -> None:
    execution = rig.start("terminal")
    rig.wait_registered(execution)
    assert rig.store.get(NAME) is not None  # the waiter's PUT also tracks the job
    time.sleep(0.3)
    assert rig.sfn.describe_execution(executionArn=execution)["status"] == "RUNNING"
    rig.report("SUCCEEDED", output_file_uri="files/out-1")
    before = rig.store.get(NAME)
    assert handle(bus_event(), rig.resumer) == {
        "names": 1,
        "succeeded": 1,
        "failed": 0,
        "gone": 0,
        "retry-later": 0,
        "pending": 0,
    }
    done = rig.finished(execution)
    assert done["status"] == "SUCCEEDED", done
    output = json.loads(done["output"])
    assert (output["name"], output["state"], output["results"]) == (NAME, "SUCCEEDED", None)
    assert output["details"]["output_file_uri"] == "files/out-1"
    assert rig.waiters.list(NAME) == [] and rig.store.get(NAME) == before
    # Delivered again (at least once): nothing left to resume, nothing changes.
    assert handle(bus_event(), rig.resumer)["succeeded"] == 0


def test_a_failed_job_fails_the_task_and_the_execution_takes_its_catch(rig: Rig) -> None:
    execution = rig.start("terminal")
    rig.wait_registered(execution)
    rig.report("FAILED", error_message="quota exceeded")
    handle(bus_event(), rig.resumer)
    done = rig.finished(execution)
    assert (done["status"], done.get("error")) == ("FAILED", "BatchDidNotSucceed"), done


def test_archived_resumes_with_the_results_location(archiving_rig: Rig) -> None:
    rig = archiving_rig
    rig.report("SUCCEEDED")  # the job is already done: the waiter is resumed at registration
    execution = rig.start("archived")
    done = rig.finished(execution)
    assert done["status"] == "SUCCEEDED", done
    output = json.loads(done["output"])
    assert output["results"]["objects"] == [
        {"location": "s3://results-bucket/batches/example-1/out.jsonl"}
    ]
    assert rig.waiters.list(NAME) == []


def test_a_token_whose_task_is_over_ends_the_waiter_without_harm(rig: Rig) -> None:
    execution = rig.start("terminal")
    rig.wait_registered(execution)
    (waiter,) = rig.waiters.list(NAME)
    rig.report("SUCCEEDED")
    handle(bus_event(), rig.resumer)
    assert rig.finished(execution)["status"] == "SUCCEEDED"
    # The same token again (a repeat after a lost removal, or a task that is over): Step
    # Functions answers InvalidToken / TaskTimedOut, which ends the waiter; nothing else moves.
    rig.waiters.add(waiter, 3)
    before = rig.store.get(NAME)
    totals = handle(bus_event(), rig.resumer)
    assert totals["gone"] == 1 and totals["succeeded"] == 0
    assert rig.waiters.list(NAME) == [] and rig.store.get(NAME) == before
