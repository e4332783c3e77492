"""What a deployed stack costs a month before any job (issue 48): custom metrics, alarms, the
dashboard and the secrets, at list prices (``aws_prices.PRICES``), free tiers left out.

Pure: a loaded template (long-form intrinsics, as ``tests/e2e/harness.py`` loads it), the
deployment's parameter values and the metrics a measured day sent, in; counts and dollars out.

- **Resources** count only where their ``Condition`` holds for the parameters (the template's
  defaults, overridden as ``sam deploy --parameter-overrides`` would).
- **Alarms** are billed per alarm metric (CloudWatch pricing page: "$0.10 per alarm metric"): an
  alarm on one metric is one; a metric-math alarm is one per metric it reads (``MetricStat``),
  its expressions none.
- **Custom metrics**: each distinct (namespace, name, dimension values) the day's EMF lines
  sent is one metric-month, the most CloudWatch bills for a metric sent in every hour of a
  month. A metric sent only in some hours costs less (CloudWatch meters a custom metric only in
  the hours it is sent), so this is an upper bound for a month like the measured day.
- **Dashboards** $3 each: CloudWatch's free tier covers an account's first three (of up to 50
  metrics each), which a stack cannot count on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import aws_prices as P


class UnsupportedCondition(ValueError):
    """A condition function this evaluator does not know."""


def _value(node: Any, template: Mapping[str, Any], params: Mapping[str, str]) -> Any:
    if isinstance(node, dict) and len(node) == 1:
        ((fn, arg),) = node.items()
        if fn == "Ref":
            if arg in params:
                return params[arg]
            default = template.get("Parameters", {}).get(arg, {}).get("Default")
            if default is None:
                raise UnsupportedCondition(f"Ref {arg}: no value")
            return default
        if fn == "Fn::Join":
            delimiter, items = arg
            values = _value(items, template, params)
            if isinstance(values, str):  # a CommaDelimitedList parameter
                values = values.split(",") if values else []
            return str(delimiter).join(str(_value(v, template, params)) for v in values)
        raise UnsupportedCondition(fn)
    if isinstance(node, list):
        return [_value(v, template, params) for v in node]
    return node


def condition(name: str, template: Mapping[str, Any], params: Mapping[str, str]) -> bool:
    """Whether the template's condition ``name`` holds for the parameter values ``params``
    (the others at their defaults)."""
    return _holds(template["Conditions"][name], template, params)


def _holds(node: Any, template: Mapping[str, Any], params: Mapping[str, str]) -> bool:
    ((fn, arg),) = node.items()
    if fn in ("Condition", "Fn::Condition"):
        return condition(arg, template, params)
    if fn == "Fn::Equals":
        left, right = (_value(a, template, params) for a in arg)
        return str(left) == str(right)
    if fn == "Fn::Not":
        return not _holds(arg[0], template, params)
    if fn == "Fn::Or":
        return any(_holds(a, template, params) for a in arg)
    if fn == "Fn::And":
        return all(_holds(a, template, params) for a in arg)
    raise UnsupportedCondition(fn)


def deployed(
    template: Mapping[str, Any], params: Mapping[str, str], kind: str
) -> dict[str, Mapping[str, Any]]:
    """The resources of type ``kind`` the stack has with these parameters."""
    return {
        logical: resource
        for logical, resource in template["Resources"].items()
        if resource.get("Type") == kind
        and ("Condition" not in resource or condition(resource["Condition"], template, params))
    }


def alarm_metrics(alarm: Mapping[str, Any]) -> int:
    """Alarm metrics one alarm is billed for."""
    props = alarm.get("Properties", {})
    if "Metrics" in props:
        return sum(1 for query in props["Metrics"] if "MetricStat" in query)
    return 1


def fixed_month(
    template: Mapping[str, Any],
    params: Mapping[str, str],
    custom_metrics: Iterable[object],
) -> dict[str, Any]:
    """The month's fixed costs: counts and dollars per line, and the total."""
    alarms = deployed(template, params, "AWS::CloudWatch::Alarm")
    counts = {
        "custom metrics": len(set(custom_metrics)),
        "alarms": len(alarms),
        "alarm metrics": sum(alarm_metrics(a) for a in alarms.values()),
        "dashboards": len(deployed(template, params, "AWS::CloudWatch::Dashboard")),
        "secrets": len(deployed(template, params, "AWS::SecretsManager::Secret")),
    }
    usd = {
        "custom metrics": P.PRICES["custom_metrics"].cost(counts["custom metrics"]),
        "alarms": P.PRICES["alarms"].cost(counts["alarm metrics"]),
        "dashboard": P.PRICES["dashboards"].cost(counts["dashboards"]),
        "secrets": P.PRICES["secrets"].cost(counts["secrets"]),
    }
    return {"counts": counts, "usd": usd, "usd_total": sum(usd.values())}
