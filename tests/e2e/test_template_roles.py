"""The roles a deployment really gets: template.yaml translated by samtranslator (the SAM
transform), so that what SAM adds on its own (an event source's managed policy) is seen too.

Issue 24 item 5: SAM's DynamoDB event gave the notifier the managed
AWSLambdaDynamoDBExecutionRole, which reads every stream in the account. The same rule holds for
every stream consumer (the waiter resumer reads two streams): an explicit role whose stream
statements name exactly the streams its mappings consume.

Issue 31: the resumer may answer Step Functions tasks and durable callbacks only of the ARNs the
operator named (WaiterStateMachineArns / WaiterDurableFunctionArns); with the defaults (empty)
its role has no statement for them at all. Statements are read with the template's conditions
decided (``tests.support.cfn_conditions``) for the parameters' defaults unless a test names
others.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.cfn_conditions import decided
from tests.support.prerequisites import require

ROOT = Path(__file__).resolve().parents[2]
TOOLS_PYTHON = ROOT / ".tools-venv" / "bin" / "python"
ALLOWED_MANAGED = {"AWSLambdaBasicExecutionRole", "AWSXrayWriteOnlyAccess"}
# An operator who enabled both kinds of waiter.
WAITERS_NAMED = {
    "WaiterStateMachineArns": "arn:aws:states:us-east-1:123456789012:stateMachine:flow",
    "WaiterDurableFunctionArns": "arn:aws:lambda:us-east-1:123456789012:function:durable",
}


@pytest.fixture(scope="module")
def translated() -> dict[str, Any]:
    require(
        TOOLS_PYTHON.exists(),
        "the tools environment (.tools-venv, samtranslator) is missing: run `make tools`",
        fail_prefix="",
        skip_prefix="",
    )
    out = subprocess.run(
        [str(TOOLS_PYTHON), str(ROOT / "tests" / "support" / "sam_translate.py"), "template.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def roles(translated: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in translated["Resources"].items() if v["Type"] == "AWS::IAM::Role"}


def managed_names(role: dict[str, Any]) -> set[str]:
    names = set()
    for arn in role["Properties"].get("ManagedPolicyArns", []):
        text = arn["Fn::Sub"] if isinstance(arn, dict) else arn
        names.add(text.rsplit("/", 1)[-1])
    return names


def role_statements(
    role: dict[str, Any], translated: dict[str, Any], parameters: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The role's statements as deployed with ``parameters`` (else the defaults)."""
    out: list[dict[str, Any]] = []
    for policy in role["Properties"].get("Policies", []):
        out.extend(decided(policy["PolicyDocument"]["Statement"], translated, parameters))
    return out


def actions(statement: dict[str, Any]) -> set[str]:
    value = statement["Action"]
    return {value} if isinstance(value, str) else set(value)


def stream_sources(resources: dict[str, Any], function: str) -> list[Any]:
    """The stream ARNs of a function's event source mappings, in the template's order."""
    return [
        r["Properties"]["EventSourceArn"]
        for r in resources.values()
        if r["Type"] == "AWS::Lambda::EventSourceMapping"
        and r["Properties"]["FunctionName"] == {"Ref": function}
    ]


FUNCTION_ROLES = (
    "NotifyFunctionRole",
    "WebhookFunctionRole",
    "ReconcileFunctionRole",
    "ArchiverFunctionRole",
    "SubmitFunctionRole",
    "WaiterResumerFunctionRole",
)


def test_no_role_gets_a_managed_policy_beyond_logs_and_tracing(
    translated: dict[str, Any],
) -> None:
    found = roles(translated)
    assert set(FUNCTION_ROLES) <= set(found)
    # Every role of the deployment, the ones SAM generates included (schedules, ...).
    for name, role in found.items():
        assert "AWSLambdaDynamoDBExecutionRole" not in managed_names(role), name
        assert managed_names(role) <= ALLOWED_MANAGED, name
    for name in FUNCTION_ROLES:
        assert managed_names(found[name]) == ALLOWED_MANAGED, name


def test_every_function_uses_the_role_it_is_checked_by(translated: dict[str, Any]) -> None:
    resources = translated["Resources"]
    functions = {k for k, v in resources.items() if v["Type"] == "AWS::Lambda::Function"}
    assert functions == {role.removesuffix("Role") for role in FUNCTION_ROLES}  # none unchecked
    for role in FUNCTION_ROLES:
        function = role.removesuffix("Role")
        assert resources[function]["Properties"]["Role"] == {"Fn::GetAtt": [role, "Arn"]}, role


def test_the_notifier_reads_only_its_tables_stream(translated: dict[str, Any]) -> None:
    resources = translated["Resources"]
    function = resources["NotifyFunction"]["Properties"]
    assert function["Role"] == {"Fn::GetAtt": ["NotifyFunctionRole", "Arn"]}
    role = resources["NotifyFunctionRole"]
    assert "AWSLambdaDynamoDBExecutionRole" not in managed_names(role)
    by_action = {a: s for s in role_statements(role, translated) for a in actions(s)}
    assert set(by_action) == {
        "dynamodb:DescribeStream",
        "dynamodb:GetRecords",
        "dynamodb:GetShardIterator",
        "dynamodb:ListStreams",
        "events:PutEvents",
        "sqs:SendMessage",
    }
    stream = {"Fn::GetAtt": ["OperationsTable", "StreamArn"]}
    for action in ("dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"):
        assert by_action[action]["Resource"] == stream, action
    assert by_action["dynamodb:ListStreams"]["Resource"] == {
        "Fn::Sub": "${OperationsTable.Arn}/stream/*"
    }
    assert by_action["events:PutEvents"]["Resource"] == {"Fn::GetAtt": ["EventBus", "Arn"]}
    assert by_action["sqs:SendMessage"]["Resource"] == {
        "Fn::GetAtt": ["NotifyDeadLetterQueue", "Arn"]
    }
    # The notifier's stream mapping itself is on this table's stream.
    assert stream_sources(resources, "NotifyFunction") == [stream]


@pytest.mark.parametrize("named", [False, True], ids=["defaults", "arns-named"])
def test_the_waiter_resumer_reads_only_the_two_streams_it_consumes(
    translated: dict[str, Any], named: bool
) -> None:
    resources = translated["Resources"]
    function = resources["WaiterResumerFunction"]["Properties"]
    assert function["Role"] == {"Fn::GetAtt": ["WaiterResumerFunctionRole", "Arn"]}
    role = resources["WaiterResumerFunctionRole"]
    assert "AWSLambdaDynamoDBExecutionRole" not in managed_names(role)
    streams = [
        {"Fn::GetAtt": ["WaitersTable", "StreamArn"]},
        {"Fn::GetAtt": ["OperationsTable", "StreamArn"]},
    ]
    # Its mappings: the waiters table's stream (a waiter registered) and the operations
    # table's (an archive settled as none / expired); exactly these, nothing else.
    consumed = stream_sources(resources, "WaiterResumerFunction")
    assert sorted(map(json.dumps, consumed)) == sorted(map(json.dumps, streams))
    by_action: dict[str, dict[str, Any]] = {}
    for statement in role_statements(role, translated, WAITERS_NAMED if named else None):
        assert statement["Effect"] == "Allow", statement
        for action in actions(statement):
            assert action not in by_action, action  # one statement per action
            by_action[action] = statement
    resume = {
        "states:SendTaskSuccess",
        "states:SendTaskFailure",
        "lambda:SendDurableExecutionCallbackSuccess",
        "lambda:SendDurableExecutionCallbackFailure",
    }
    assert set(by_action) == {
        "dynamodb:DescribeStream",
        "dynamodb:GetRecords",
        "dynamodb:GetShardIterator",
        "dynamodb:ListStreams",
        "dynamodb:GetItem",
        "dynamodb:Query",
        "dynamodb:DeleteItem",
        "dynamodb:UpdateItem",
        "sqs:SendMessage",
    } | (resume if named else set())
    for action in ("dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"):
        assert by_action[action]["Resource"] == streams, action
    assert by_action["dynamodb:ListStreams"]["Resource"] == [
        {"Fn::Sub": "${WaitersTable.Arn}/stream/*"},
        {"Fn::Sub": "${OperationsTable.Arn}/stream/*"},
    ]
    assert by_action["dynamodb:GetItem"]["Resource"] == {"Fn::GetAtt": ["OperationsTable", "Arn"]}
    for action in ("dynamodb:Query", "dynamodb:DeleteItem", "dynamodb:UpdateItem"):
        assert by_action[action]["Resource"] == {"Fn::GetAtt": ["WaitersTable", "Arn"]}, action
    if named:  # with the defaults (empty) no statement resumes anything (issue 31)
        for action in ("states:SendTaskSuccess", "states:SendTaskFailure"):
            assert by_action[action]["Resource"] == {"Ref": "WaiterStateMachineArns"}, action
        for action in (
            "lambda:SendDurableExecutionCallbackSuccess",
            "lambda:SendDurableExecutionCallbackFailure",
        ):
            assert by_action[action]["Resource"] == {"Ref": "WaiterDurableFunctionArns"}, action
    # The mappings' and the async invocations' OnFailure destination.
    assert by_action["sqs:SendMessage"]["Resource"] == {
        "Fn::GetAtt": ["WaiterDeadLetterQueue", "Arn"]
    }


@pytest.mark.parametrize("named", [False, True], ids=["defaults", "arns-named"])
def test_no_role_statement_allows_every_resource(translated: dict[str, Any], named: bool) -> None:
    for name, role in roles(translated).items():
        for statement in role_statements(role, translated, WAITERS_NAMED if named else None):
            resource = statement["Resource"]
            listed = resource if isinstance(resource, list) else [resource]
            assert "*" not in listed, (name, statement)


def s3_reads(role: dict[str, Any], translated: dict[str, Any]) -> list[Any]:
    """The object resources a role may GetObject (or any s3:*) from, as deployed."""
    out: list[Any] = []
    for statement in role_statements(role, translated):
        if actions(statement) & {"s3:GetObject", "s3:GetObject*", "s3:*", "s3:Get*"}:
            resource = statement["Resource"]
            out.extend(resource if isinstance(resource, list) else [resource])
    return out


def test_the_submit_function_reads_only_incoming_and_its_markers(
    translated: dict[str, Any],
) -> None:
    """Issue 38, repro 6: the submit path's own role. It may read an input under incoming/ of
    the results bucket, its submit markers and its own temporary upload; never results/*
    (anyone's kept prompts, issue 47, and outputs), never another function's reserved
    executions."""
    found = roles(translated)
    resources = translated["Resources"]
    assert resources["SubmitFunction"]["Properties"]["Role"] == {
        "Fn::GetAtt": ["SubmitFunctionRole", "Arn"]
    }
    reads = s3_reads(found["SubmitFunctionRole"], translated)
    assert sorted(map(json.dumps, reads)) == sorted(
        json.dumps({"Fn::Sub": f"${{ResultsBucket.Arn}}/{prefix}"})
        for prefix in (
            "incoming/*",
            "results/inputs/*/submit-*.json",
            "results/.incoming/*",  # its own upload, copied into place (CopyObject reads it)
        )
    )
    # Its own concurrency: neither the archiver's two executions nor the account's pool.
    submit = resources["SubmitFunction"]["Properties"]
    archiver = resources["ArchiverFunction"]["Properties"]
    assert submit["ReservedConcurrentExecutions"] == 2
    assert archiver["ReservedConcurrentExecutions"] == 2
    # The archiver's role still reads incoming/: the input of a batch tracked with one.
    archiver_reads = s3_reads(found["ArchiverFunctionRole"], translated)
    assert {"Fn::Sub": "${ResultsBucket.Arn}/incoming/*"} in archiver_reads
