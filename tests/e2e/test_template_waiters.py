"""Issue 31 (no confused deputy), on the source template: waiters are off until the operator
names the ARNs they may resume.

A producer allowed only ``PUT /operations/{name}`` could attach another workflow's task token to
its own job and report it SUCCEEDED; with ``WaiterStateMachineArns`` defaulting to ``*`` the
resumer answered any state machine's token. Now both parameters default to empty: the resumer's
role then has no ``states:SendTask*`` / ``lambda:SendDurableExecutionCallback*`` statement at
all, and both functions are told that the kind is off (the API answers 400). ``*`` stays
possible, as an explicit value. No build and no tools needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.harness import BuiltTemplate
from tests.support.cfn_conditions import condition, decided
from tests.support.template import load_template

RESUME_ACTIONS = (
    "states:SendTaskSuccess",
    "states:SendTaskFailure",
    "states:SendTaskHeartbeat",
    "lambda:SendDurableExecutionCallbackSuccess",
    "lambda:SendDurableExecutionCallbackFailure",
    "lambda:SendDurableExecutionCallbackHeartbeat",
)
STATE_MACHINES = (
    "arn:aws:states:eu-west-1:123456789012:stateMachine:flow,"
    "arn:aws:states:eu-west-1:123456789012:stateMachine:other"
)
VARIABLES = {
    "WaiterStateMachineArns": "OPSTATE_WAITER_STATE_MACHINE_ARNS",
    "WaiterDurableFunctionArns": "OPSTATE_WAITER_DURABLE_FUNCTION_ARNS",
}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def _statements(node: Any) -> Iterator[dict[str, Any]]:
    """Every IAM statement anywhere in ``node`` (roles, inline function policies, ...)."""
    if isinstance(node, dict):
        if "Effect" in node and "Action" in node:
            yield node
        for value in node.values():
            yield from _statements(value)
    elif isinstance(node, list):
        for value in node:
            yield from _statements(value)


def _actions(statement: dict[str, Any]) -> set[str]:
    value = statement["Action"]
    return {value} if isinstance(value, str) else set(value)


def granted(template: dict[str, Any], parameters: dict[str, str] | None = None) -> set[str]:
    """The resume actions any statement of the stack grants, deployed with ``parameters``."""
    resources = decided(template["Resources"], template, parameters)
    return {
        action
        for statement in _statements(resources)
        for action in _actions(statement)
        if action.startswith(("states:SendTask", "lambda:SendDurableExecutionCallback"))
    }


def test_both_parameters_default_to_nothing_and_star_is_only_an_explicit_choice(
    template: dict[str, Any],
) -> None:
    for name in VARIABLES:
        parameter = template["Parameters"][name]
        assert parameter["Type"] == "CommaDelimitedList"
        assert parameter["Default"] == "", name
        assert '"*"' in parameter["Description"] and "explicit" in parameter["Description"]


def test_with_the_defaults_no_statement_may_resume_any_task(template: dict[str, Any]) -> None:
    assert granted(template) == set()
    assert not condition(template, "HasWaiterStateMachines", {})
    assert not condition(template, "HasWaiterDurableFunctions", {})


def test_naming_arns_grants_resuming_on_exactly_those(template: dict[str, Any]) -> None:
    only_sfn = {"WaiterStateMachineArns": STATE_MACHINES}
    assert granted(template, only_sfn) == {"states:SendTaskSuccess", "states:SendTaskFailure"}
    role = decided(template["Resources"]["WaiterResumerFunctionRole"], template, only_sfn)
    (statement,) = (s for s in _statements(role) if "states:SendTaskSuccess" in _actions(s))
    assert statement["Resource"] == {"Ref": "WaiterStateMachineArns"}
    both = {**only_sfn, "WaiterDurableFunctionArns": "*"}  # "*": the explicit choice
    assert granted(template, both) == set(RESUME_ACTIONS) - {
        "states:SendTaskHeartbeat",
        "lambda:SendDurableExecutionCallbackHeartbeat",
    }
    # Only the resumer may: the API registers, it never answers a task.
    for name, resource in template["Resources"].items():
        if name != "WaiterResumerFunctionRole":
            assert granted({**template, "Resources": {name: resource}}, both) == set(), name


@pytest.mark.parametrize("function", ["WebhookFunction", "WaiterResumerFunction"])
def test_the_functions_are_told_which_kinds_are_enabled(
    template: dict[str, Any], function: str
) -> None:
    variables = template["Resources"][function]["Properties"]["Environment"]["Variables"]
    harness = BuiltTemplate(template)
    for parameter, variable in VARIABLES.items():
        assert variables[variable] == {"Fn::Join": [",", {"Ref": parameter}]}
        # What the function reads, as CloudFormation would pass it: "" (off) by default.
        assert harness.resolve(variables[variable], {}) == ""
        named = harness.resolve(variables[variable], {parameter: STATE_MACHINES})
        assert named == STATE_MACHINES
