"""The waiters' settings (docs/waiters.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.config.parse import ConfigError, Part, given, read_int, read_str, settings_part

DEFAULT_MAX_WAITERS = 10


def _arns(env: Mapping[str, str], key: str) -> tuple[str, ...] | None:
    """Comma-separated ARNs, or ``*``; anything else (``none``, ``off``) is refused, so that no
    value meant to turn waiters off turns them on."""
    arns = tuple(
        dict.fromkeys(a.strip() for a in (read_str(env, key) or "").split(",") if a.strip())
    )
    for arn in arns:
        if arn != "*" and not arn.startswith("arn:"):
            raise ConfigError(f"{key} must be ARNs separated by commas, or '*', got {arn!r}")
    return arns or None


@settings_part
class WaiterSettings(Part):
    """Waiters (docs/waiters.md): their DynamoDB table, the bound per operation, and the ARNs
    that enable each kind of waiter."""

    # The waiters table (DynamoDB stores only; SQLite keeps waiters in its own file). Unset
    # with a DynamoDB store: waiters are not enabled and a waiter is refused.
    waiters_table_name: str | None = None
    max_waiters: int = DEFAULT_MAX_WAITERS
    # The template's WaiterStateMachineArns / WaiterDurableFunctionArns ("*": any). Empty: that
    # kind of waiter is not enabled (opstate.waiters.enabled).
    waiter_state_machine_arns: tuple[str, ...] = ()
    waiter_durable_function_arns: tuple[str, ...] = ()

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        return given(
            waiters_table_name=read_str(env, "OPSTATE_WAITERS_TABLE_NAME"),
            max_waiters=read_int(env, "OPSTATE_MAX_WAITERS_PER_OPERATION", minimum=1),
            waiter_state_machine_arns=_arns(env, "OPSTATE_WAITER_STATE_MACHINE_ARNS"),
            waiter_durable_function_arns=_arns(env, "OPSTATE_WAITER_DURABLE_FUNCTION_ARNS"),
        )
