"""What a record's ``details`` may hold: the one place that knows the stores' real limits.

Details come from senders (webhook bodies, a producer's reports, polled SDK objects) and end up
in a DynamoDB map or a SQLite JSON column. DynamoDB refuses, with a ``ValidationException``,
values that test doubles (moto) accept; SQLite accepts nearly anything and a later reader then
chokes on it. So every limit is enforced here, the same for both stores:

- numbers: finite, at most 38 significant digits, magnitude 1e-130 to below 1e126 (or zero);
- nesting: at most ``MAX_DEPTH`` levels of maps and lists below the details map itself (the
  details map is one level of the item, DynamoDB allows 32);
- map keys: non-empty strings;
- strings (keys and values): no lone UTF-16 surrogates (they cannot be encoded as UTF-8);
- size: at most ``MAX_DETAILS_BYTES`` of compact UTF-8 JSON for a record's whole details, so an
  item stays far below DynamoDB's 400 KB and a state change always fits.

Two uses:
- ``check`` (strict): a producer's report with a problem is refused whole
  (``InvalidDetailsError``: 400 ``invalid-details``, nothing written).
- ``sanitize`` (lenient): for Gemini's webhooks and polled answers, whose state must still apply:
  out-of-range numbers become their text, lone surrogates become U+FFFD, entries with empty keys
  or nested too deep are dropped, other python values become their text; each change is
  reported as a ``Problem`` so the caller logs it.

``fit`` drops whole top-level keys, largest first, until details fit the size cap.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

MAX_DETAILS_BYTES = 64 * 1024
# Detail keys that describe the state they arrived with: cleared when the state changes
# (``reducer``).
STATE_SCOPED_KEYS: frozenset[str] = frozenset(
    {"reason", "cancelling", "paused", "partial", "error_code", "error_message"}
)
# Detail keys that describe one observation: cleared by any applied event that lacks them.
OBSERVATION_SCOPED_KEYS: frozenset[str] = frozenset({"not_found"})
# Maps/lists inside the details map. The item is level 0 for DynamoDB's count, ``details``
# level 1; 30 more keeps a margin under DynamoDB's 32.
MAX_DEPTH = 30
MAX_DIGITS = 38
MIN_EXPONENT = -130  # smallest magnitude 1e-130
MAX_EXPONENT = 125  # largest magnitude 9.99...e125
_REPLACEMENT = "\ufffd"
# 2**420 > 1e126: any int this long is out of range (and is never turned into digits, which
# Python refuses past 4,300 of them).
_MAX_BITS = 420
_MAX_PATH = 100


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing in a details value that a store cannot hold, at ``path`` (``$.a[0].b``)."""

    path: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


class InvalidDetailsError(ValueError):
    """Details a store cannot hold; ``problems`` lists every one found (at least one)."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(problems)
        shown = "; ".join(str(p) for p in self.problems[:3])
        more = len(self.problems) - 3
        suffix = f" (and {more} more)" if more > 0 else ""
        super().__init__(f"invalid details: {shown}{suffix}")


def number_problem(value: int | float | Decimal) -> str | None:
    """Why a store cannot hold ``value`` as a number, or None when it can."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return "not a finite number"
        number = Decimal(repr(value))
    elif isinstance(value, int) and abs(value).bit_length() > _MAX_BITS:
        return "magnitude outside 1e-130 .. 9.99e125"
    else:
        number = Decimal(value)
    if not number.is_finite():
        return "not a finite number"
    if number.is_zero():
        return None
    significant = "".join(map(str, number.as_tuple().digits)).strip("0")
    if len(significant) > MAX_DIGITS:
        return f"more than {MAX_DIGITS} significant digits"
    exponent = number.adjusted()
    if exponent < MIN_EXPONENT or exponent > MAX_EXPONENT:
        return "magnitude outside 1e-130 .. 9.99e125"
    return None


def _number_text(value: int | float | Decimal) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int) and abs(value).bit_length() > 4 * _MAX_BITS:
        return f"{'-' if value < 0 else ''}integer of {abs(value).bit_length()} bits"
    return str(value)


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _clean_text(text: str) -> str:
    return "".join(_REPLACEMENT if "\ud800" <= ch <= "\udfff" else ch for ch in text)


class _Walk:
    """One pass over a details value: the cleaned copy, and every problem noted on the way
    (``check`` refuses on any, ``sanitize`` reports them)."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def note(self, path: str, why: str) -> None:
        shown = path if len(path) <= _MAX_PATH else path[: _MAX_PATH - 3] + "..."
        self.problems.append(Problem(shown, why))

    def value(self, value: Any, path: str, depth: int) -> tuple[bool, Any]:
        """(keep, cleaned value) of one value at ``depth`` (details' own entries: depth 1)."""
        if value is None or isinstance(value, bool):
            return True, value
        if isinstance(value, int | float | Decimal):
            return True, self.number(value, path)
        if isinstance(value, str):
            return True, self.text(value, path)
        if isinstance(value, Mapping | list | tuple):
            return self.container(value, path, depth)
        self.note(path, f"not a JSON value ({type(value).__name__})")
        return True, str(value)

    def number(self, value: int | float | Decimal, path: str) -> Any:
        """``value`` itself, or its text (noted) when a store cannot hold it as a number."""
        why = number_problem(value)
        if why is None:
            return value
        self.note(path, why)
        return _number_text(value)

    def text(self, value: str, path: str) -> str:
        """``value`` with any lone surrogate replaced (noted)."""
        if _has_lone_surrogate(value):
            self.note(path, "lone surrogate in text")
            return _clean_text(value)
        return value

    def container(
        self, value: Mapping[Any, Any] | list[Any] | tuple[Any, ...], path: str, depth: int
    ) -> tuple[bool, Any]:
        """(keep, cleaned copy) of a map or a list; dropped (noted) beyond ``MAX_DEPTH``."""
        if depth > MAX_DEPTH:
            self.note(path, f"nested deeper than {MAX_DEPTH} levels")
            return False, None
        if isinstance(value, Mapping):
            return True, self.mapping(value, path, depth)
        out: list[Any] = []
        for i, item in enumerate(value):
            keep, cleaned = self.value(item, f"{path}[{i}]", depth + 1)
            if keep:
                out.append(cleaned)
        return True, out

    def mapping(self, value: Mapping[Any, Any], path: str, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for raw_key, item in value.items():
            key = raw_key if isinstance(raw_key, str) else str(raw_key)
            surrogate = _has_lone_surrogate(key)
            # The path shows the key cleaned (character by character: only when it needs it).
            child = f"{path}.{(_clean_text(key) if surrogate else key)[:40]}"
            if key == "":
                self.note(child, "empty key")
                continue
            if key is not raw_key:
                self.note(child, "key is not a string")
            if surrogate:
                self.note(child, "lone surrogate in key")
                key = _clean_text(key)
            keep, cleaned = self.value(item, child, depth + 1)
            if keep:
                out[key] = cleaned
        return out


def size(details: Mapping[str, Any]) -> int:
    """Bytes of ``details`` as compact UTF-8 JSON (the measure of ``MAX_DETAILS_BYTES``)."""
    text = json.dumps(details, ensure_ascii=False, separators=(",", ":"), default=str)
    return len(text.encode("utf-8", "surrogatepass"))


def sanitize(details: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[Problem, ...]]:
    """Details every store can hold, and what was changed to get there (empty if nothing).

    Values are normalised or dropped entry by entry (see the module docstring); then whole
    top-level keys are dropped, largest first, until the size cap is met.
    """
    walk = _Walk()
    cleaned = walk.mapping(details, "$", 0)
    fitted, dropped = fit(cleaned)
    problems = list(walk.problems)
    problems.extend(
        Problem(f"$.{key[:40]}", "dropped: details over the size cap") for key in dropped
    )
    return fitted, tuple(problems)


def check(details: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of ``details`` if every store can hold it; else ``InvalidDetailsError``."""
    walk = _Walk()
    cleaned = walk.mapping(details, "$", 0)
    if walk.problems:
        raise InvalidDetailsError(walk.problems)
    total = size(cleaned)
    if total > MAX_DETAILS_BYTES:
        raise InvalidDetailsError(
            [Problem("$", f"{total} bytes as JSON, more than {MAX_DETAILS_BYTES}")]
        )
    return cleaned


def fit(
    details: Mapping[str, Any], keep: Iterable[str] = (), limit: int = MAX_DETAILS_BYTES
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``details`` within ``limit`` bytes, and the top-level keys dropped to get there.

    Keys not in ``keep`` go first, then those in ``keep``; within each group the largest
    entry goes first (ties by key, so the result is deterministic).
    """
    out = dict(details)
    if size(out) <= limit:
        return out, ()
    protected = set(keep)
    # Compact JSON of a map: braces, one comma between entries, and each entry's own bytes.
    entry = {key: size({key: value}) - 2 for key, value in out.items()}
    total = 2 + sum(entry.values()) + max(0, len(entry) - 1)

    def order(key: str) -> tuple[bool, int, str]:
        return (key in protected, -entry[key], key)

    dropped: list[str] = []
    for key in sorted(out, key=order):
        if total <= limit:
            break
        del out[key]
        dropped.append(key)
        total -= entry[key] + (1 if out else 0)
    return out, tuple(dropped)
