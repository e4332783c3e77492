"""The roles a deployment really gets: template.yaml translated by samtranslator (the SAM
transform), so that what SAM adds on its own (an event source's managed policy) is seen too.

Issue 24 item 5: SAM's DynamoDB event gave the notifier the managed
AWSLambdaDynamoDBExecutionRole, which reads every stream in the account.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.prerequisites import require

ROOT = Path(__file__).resolve().parents[2]
TOOLS_PYTHON = ROOT / ".tools-venv" / "bin" / "python"
ALLOWED_MANAGED = {"AWSLambdaBasicExecutionRole", "AWSXrayWriteOnlyAccess"}


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


def role_statements(role: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for policy in role["Properties"].get("Policies", []):
        out.extend(policy["PolicyDocument"]["Statement"])
    return out


def actions(statement: dict[str, Any]) -> set[str]:
    value = statement["Action"]
    return {value} if isinstance(value, str) else set(value)


def test_no_function_role_gets_a_managed_policy_beyond_logs_and_tracing(
    translated: dict[str, Any],
) -> None:
    found = roles(translated)
    assert {"NotifyFunctionRole", "WebhookFunctionRole", "ReconcileFunctionRole"} <= set(found)
    for name in ("NotifyFunctionRole", "WebhookFunctionRole", "ReconcileFunctionRole"):
        assert managed_names(found[name]) <= ALLOWED_MANAGED, name


def test_the_notifier_reads_only_its_tables_stream(translated: dict[str, Any]) -> None:
    resources = translated["Resources"]
    function = resources["NotifyFunction"]["Properties"]
    assert function["Role"] == {"Fn::GetAtt": ["NotifyFunctionRole", "Arn"]}
    role = resources["NotifyFunctionRole"]
    assert "AWSLambdaDynamoDBExecutionRole" not in managed_names(role)
    by_action = {a: s for s in role_statements(role) for a in actions(s)}
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
    mappings = [
        r["Properties"]
        for r in resources.values()
        if r["Type"] == "AWS::Lambda::EventSourceMapping"
        and r["Properties"]["FunctionName"] == {"Ref": "NotifyFunction"}
    ]
    assert [m["EventSourceArn"] for m in mappings] == [stream]


def test_no_role_statement_allows_every_resource(translated: dict[str, Any]) -> None:
    for name, role in roles(translated).items():
        for statement in role_statements(role):
            resource = statement["Resource"]
            listed = resource if isinstance(resource, list) else [resource]
            assert "*" not in listed, (name, statement)
