"""Which custom metrics the functions send (issue 48): the core set always, the rest only with
``OPSTATE_DETAILED_METRICS=true`` (the template's ``DetailedMetrics`` parameter, ``false`` by
default on AWS, where CloudWatch bills every custom metric; unset, as locally, everything is
sent). ``opstate.observability`` decides with ``detailed_metrics``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.config.parse import Part, given, read_bool, settings_part

DETAILED_METRICS_VARIABLE = "OPSTATE_DETAILED_METRICS"


def detailed_metrics(env: Mapping[str, str]) -> bool:
    """Whether every metric is sent (``OPSTATE_DETAILED_METRICS``; unset: yes)."""
    value = read_bool(env, DETAILED_METRICS_VARIABLE)
    return True if value is None else value


@settings_part
class MetricsSettings(Part):
    """The metrics switch (docs/deploy.md, "What it costs to keep running")."""

    detailed_metrics: bool = True

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        return given(detailed_metrics=read_bool(env, DETAILED_METRICS_VARIABLE))
