"""The one JSON rule: strict JSON in (RFC 8259), strict JSON out.

Every input path uses ``loads``: the HTTP API (webhook bodies and reports, also behind the local
server), ``opstate replay`` and ``opstate report --details``. It accepts what a strict JSON
parser accepts: UTF-8 text (bytes in UTF-16/32 are decoded as ``json.loads`` detects them), no
``NaN``/``Infinity``/``-Infinity`` (Python's ``json`` takes them by default) and no number that
only a float infinity could hold (``1e400``), and any failure -
including nesting too deep for the parser - is one ``InvalidJSONError`` (a ``ValueError``),
never a ``RecursionError``.

Every output uses ``dumps`` with ``allow_nan=False``. A non-finite number can only reach it from
data stored before this rule (an older ``opstate replay`` into SQLite took ``NaN``): it is
written as ``null``, so a reader's strict parser never sees ``NaN``.
"""

from __future__ import annotations

import json
import math
from typing import Any


class InvalidJSONError(ValueError):
    """The input is not strict JSON; ``message`` says why, in a few words."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _reject_constant(value: str) -> Any:
    raise InvalidJSONError(f"{value} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: valid syntax, but no finite number to keep
        raise InvalidJSONError(f"the number {text[:40]} is out of range")
    return value


def loads(raw: bytes | bytearray | str) -> Any:
    """The value of ``raw`` (bytes in the encodings ``json.loads`` detects, or text), or
    ``InvalidJSONError``."""
    try:
        return json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)
    except InvalidJSONError:
        raise
    except UnicodeDecodeError:
        raise InvalidJSONError("not UTF-8 text") from None
    except RecursionError:
        raise InvalidJSONError("nested too deeply") from None
    except ValueError as exc:
        raise InvalidJSONError(str(exc)) from None


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def dumps(
    value: Any,
    *,
    indent: int | None = None,
    sort_keys: bool = False,
    compact: bool = False,
) -> str:
    """Strict JSON text of ``value`` (non-ASCII kept as is); ``compact`` drops the spaces."""
    options: dict[str, Any] = {
        "indent": indent,
        "sort_keys": sort_keys,
        "ensure_ascii": False,
        "allow_nan": False,
    }
    if compact:
        options["separators"] = (",", ":")
    try:
        text = json.dumps(value, **options)
    except ValueError:
        # Out of range float values (NaN, Infinity): only in data stored before the rule.
        text = json.dumps(_finite(value), **options)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (only in data stored before details were checked) cannot be UTF-8:
        # the ASCII form escapes it as \udXXX, still JSON, so the text can always be sent.
        options["ensure_ascii"] = True
        text = json.dumps(_finite(value), **options)
    return text


__all__ = ["InvalidJSONError", "dumps", "loads"]
