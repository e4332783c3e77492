"""Which kinds of waiter are enabled: a kind is enabled only once the operator named the ARNs
its tasks may be resumed on (issue 31: no confused deputy).

A producer that may only report on its own jobs could otherwise attach any workflow's task
token to one of them, report it SUCCEEDED with details of its choosing, and have the resumer
answer that token with this system's rights. A task token does not say which state machine
issued it, so no code here can check where a token comes from; what restricts which workflows
can be resumed is the IAM policy on the named ARNs (the template grants
``states:SendTaskSuccess`` / ``SendTaskFailure`` on ``WaiterStateMachineArns`` only, and nothing
at all while it is empty). Until then the kind is off: a registration is refused (API 400) and
the resumer sends nothing for a waiter of that kind (it ends as gone, code
``WaitersNotEnabled``). ``*`` enables any ARN, only as an explicit choice.
"""

from __future__ import annotations

from typing import Final

from opstate.config import WaiterSettings
from opstate.waiters.model import Target

# What enables each kind: the template parameter and the environment variable it is passed
# as (the one ``opstate serve`` reads), and what the ARNs name.
ENABLED_BY: Final = {
    Target.STEP_FUNCTIONS: (
        "Step Functions",
        "WaiterStateMachineArns",
        "OPSTATE_WAITER_STATE_MACHINE_ARNS",
        "state machine",
    ),
    Target.LAMBDA_DURABLE: (
        "Lambda durable",
        "WaiterDurableFunctionArns",
        "OPSTATE_WAITER_DURABLE_FUNCTION_ARNS",
        "durable function",
    ),
}
# The code a waiter of a kind that is not enabled ends with (``WaitersResumed{outcome=gone}``).
NOT_ENABLED_CODE: Final = "WaitersNotEnabled"
ALL_TARGETS: Final = frozenset(Target)


class TargetNotEnabledError(Exception):
    """A waiter of a kind the operator has not enabled (its ARNs are not set)."""

    def __init__(self, target: Target) -> None:
        kind, parameter, variable, resource = ENABLED_BY[target]
        super().__init__(
            f"{kind} waiters are not enabled: set {parameter} ({variable} for opstate serve) "
            f"to the {resource} ARNs whose tasks may be resumed"
        )
        self.target = target


def enabled_targets(settings: WaiterSettings) -> frozenset[Target]:
    """The kinds of waiter whose ARNs are set."""
    enabled: set[Target] = set()
    if settings.waiter_state_machine_arns:
        enabled.add(Target.STEP_FUNCTIONS)
    if settings.waiter_durable_function_arns:
        enabled.add(Target.LAMBDA_DURABLE)
    return frozenset(enabled)
