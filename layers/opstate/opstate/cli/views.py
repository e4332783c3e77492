"""The text form of a JSON view (``get``, ``results``, ``wait``): one ``key  value`` line per
field, a nested object as its own indented block, a list of objects one ``-`` line per item; no
JSON printed raw. ``--json`` prints the view itself (``common.print_json``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.cli.common import out
from opstate.domain.strict_json import dumps

INDENT = 2
# Blocks nest this deep at most; anything deeper is shown as compact JSON on its line (details
# come from outside: their depth is bounded, the text must stay readable anyway).
MAX_DEPTH = 3


def print_view(view: Mapping[str, Any]) -> None:
    for line in view_lines(view):
        out(line)


def view_lines(view: Mapping[str, Any], depth: int = 0) -> list[str]:
    """The lines of ``view``, keys aligned within each block."""
    pad = " " * (INDENT * depth)
    width = max((len(str(key)) for key in view), default=0)
    lines: list[str] = []
    for key, value in view.items():
        if depth < MAX_DEPTH and isinstance(value, Mapping) and value:
            lines.append(f"{pad}{key}")
            lines.extend(view_lines(value, depth + 1))
        elif depth < MAX_DEPTH and _has_objects(value):
            lines.append(f"{pad}{key}")
            lines.extend(f"{pad}{' ' * INDENT}- {inline(item)}" for item in value)
        else:
            lines.append(f"{pad}{key!s:<{width}}  {inline(value)}".rstrip())
    return lines


def inline(value: Any, depth: int = 0) -> str:
    """One value on one line: ``-`` for none or empty, a list's items joined with ``, ``, an
    object's fields as ``key value``."""
    if value is None or (isinstance(value, Mapping | list) and not value):
        return "-"
    if isinstance(value, str):
        return value
    if depth >= MAX_DEPTH:
        return dumps(value, sort_keys=True)
    if isinstance(value, Mapping):
        return ", ".join(f"{key} {inline(item, depth + 1)}" for key, item in value.items())
    if isinstance(value, list):
        return ", ".join(inline(item, depth + 1) for item in value)
    return dumps(value)


def _has_objects(value: Any) -> bool:
    return isinstance(value, list) and any(isinstance(item, Mapping | list) for item in value)
