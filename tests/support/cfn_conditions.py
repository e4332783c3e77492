"""Decide a template's ``Fn::If`` as CloudFormation would for given parameter values.

``decided(node, template, parameters)`` returns ``node`` with every ``Fn::If`` replaced by the
branch its condition picks and every ``Ref AWS::NoValue`` removed (from a list or a mapping);
everything else (``Ref`` to resources, ``Fn::GetAtt``...) is left as written. Parameters not
given take their ``Default``. Conditions may use ``Fn::Equals``, ``Fn::Not``, ``Fn::And``,
``Fn::Or``, ``Condition``, ``Ref`` (a parameter) and ``Fn::Join`` / ``Fn::Select`` over one;
anything else raises, so a test never passes on a condition it did not understand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NO_VALUE = {"Ref": "AWS::NoValue"}
_DROP = object()


class UndecidableError(ValueError):
    """A condition uses something this module does not evaluate."""


def parameter(template: Mapping[str, Any], name: str, given: Mapping[str, str]) -> Any:
    """A parameter's value: a list for a ``CommaDelimitedList``, else its text."""
    spec = template["Parameters"][name]
    text = given[name] if name in given else str(spec.get("Default", ""))
    return text.split(",") if spec.get("Type") == "CommaDelimitedList" else text


def _value(expr: Any, template: Mapping[str, Any], given: Mapping[str, str]) -> Any:
    if isinstance(expr, bool):
        return "true" if expr else "false"
    if isinstance(expr, str | int | float):
        return str(expr)
    if isinstance(expr, list):
        return [_value(e, template, given) for e in expr]
    if isinstance(expr, dict) and len(expr) == 1:
        ((fn, arg),) = expr.items()
        if fn == "Ref" and arg in template.get("Parameters", {}):
            return parameter(template, arg, given)
        if fn == "Fn::Join":
            delimiter, items = arg
            return str(delimiter).join(_value(items, template, given))
        if fn == "Fn::Select":
            index, items = arg
            return _value(items, template, given)[int(_value(index, template, given))]
    raise UndecidableError(f"cannot evaluate {expr!r}")


def condition(template: Mapping[str, Any], name: str, given: Mapping[str, str]) -> bool:
    """Whether the template's condition ``name`` holds for the parameters ``given``."""
    return _holds(template["Conditions"][name], template, given)


def _holds(expr: Any, template: Mapping[str, Any], given: Mapping[str, str]) -> bool:
    if isinstance(expr, dict) and len(expr) == 1:
        ((fn, arg),) = expr.items()
        if fn == "Fn::Equals":
            left, right = (_value(a, template, given) for a in arg)
            return bool(left == right)
        if fn == "Fn::Not":
            return not _holds(arg[0], template, given)
        if fn == "Fn::And":
            return all(_holds(a, template, given) for a in arg)
        if fn == "Fn::Or":
            return any(_holds(a, template, given) for a in arg)
        if fn == "Condition":
            return condition(template, arg, given)
    raise UndecidableError(f"cannot evaluate the condition {expr!r}")


def decided(
    node: Any, template: Mapping[str, Any], parameters: Mapping[str, str] | None = None
) -> Any:
    """``node`` with its ``Fn::If`` decided and ``AWS::NoValue`` dropped (see the module)."""
    given = parameters or {}
    out = _decide(node, template, given)
    return None if out is _DROP else out


def _decide(node: Any, template: Mapping[str, Any], given: Mapping[str, str]) -> Any:
    if node == NO_VALUE:
        return _DROP
    if isinstance(node, dict):
        if len(node) == 1 and "Fn::If" in node:
            name, if_true, if_false = node["Fn::If"]
            chosen = if_true if condition(template, name, given) else if_false
            return _decide(chosen, template, given)
        kept = {k: _decide(v, template, given) for k, v in node.items()}
        return {k: v for k, v in kept.items() if v is not _DROP}
    if isinstance(node, list):
        items = [_decide(v, template, given) for v in node]
        return [v for v in items if v is not _DROP]
    return node
