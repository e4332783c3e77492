"""The notifier's settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.config.parse import Part, given, read_str, settings_part


@settings_part
class NotifySettings(Part):
    """The notifier."""

    event_bus_name: str | None = None

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        return given(event_bus_name=read_str(env, "OPSTATE_EVENT_BUS_NAME"))
