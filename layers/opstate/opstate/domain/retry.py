"""A retry policy (issue 33; docs/retry.md): reading it from a report's ``"retry"`` object and
from ``OPSTATE_RETRY_TRANSIENT``, and how a record's retry state is shown (its lineage, the
root's ``retry`` and the final result). Pure: no store, no clock, no settings.

A retry state's ``doc`` (``opstate.store.retry_state``) is read tolerantly here: a value of the
wrong type reads as absent, so a view never fails on a document another release wrote.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opstate.domain.costs import final_cost_view

MAX_ATTEMPTS_LIMIT = 10
# Retries per key of a policy that leaves ``maxAttempts`` out while the deployment's default
# is 0 (off): giving a ``retry`` object (or a flag) is the opt-in (issue 33: "default when
# enabled: 2").
DEFAULT_ENABLED_ATTEMPTS = 2
MAX_PENDING_TIMEOUT_HOURS = 720.0
# The shortest pending timeout (issue 38): opstate never cancels a batch younger than this,
# measured from Gemini's createTime. A policy asking less is refused; one stored before the
# floor existed is clamped to it where it is used (``opstate.retry.acting``).
MIN_PENDING_TIMEOUT_HOURS = 1.0
# The longest input URI accepted (an S3 key is at most 1024 bytes).
MAX_INPUT_URI_CHARS = 2048

# The reasons a failed row may be retried for (``OPSTATE_RETRY_TRANSIENT``); ``NAME:N`` retries
# a key at most N times for that reason.
TRANSIENT_REASONS = (
    "RESOURCE_EXHAUSTED",
    "UNAVAILABLE",
    "INTERNAL",
    "DEADLINE_EXCEEDED",
    "ABORTED",
)

POLICY_KEYS = ("maxAttempts", "resubmitExpired", "pendingTimeoutHours", "input", "maxCostUSD")
# The largest ``maxCostUSD`` taken (US dollars; as ``config.retry.MAX_COST_USD``).
MAX_COST_USD = 1_000_000_000.0

_S3_URI = re.compile(r"s3://([a-z0-9.-]{3,63})/(.+)", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LIMIT = re.compile(r"[0-9]{1,2}")


class InvalidRetryError(ValueError):
    """A retry policy (or a transient table) this system cannot use; the message says why."""


@dataclass(
    frozen=True,
    slots=True,  # mutant: equivalent — slots=False changes only the memory
)
class RetryPolicy:
    """What an operation's retries may do: retries per request key (0: none), whether an
    EXPIRED batch is resubmitted whole, the pending timeout (hours; None: off) and where its
    input is (``s3://`` or ``file:///``; None: opstate holds none unless it submitted it)."""

    max_attempts: int = 0
    resubmit_expired: bool = False
    pending_timeout_hours: float | None = None
    input: str | None = None
    # What the lineage may cost in all, root included (US dollars; None: no cap; issue 41).
    max_cost_usd: float | None = None

    def as_doc(self) -> dict[str, Any]:
        """The retry state's ``policy`` map (the input is kept apart, as ``input.source``);
        ``maxCostUSD`` only when there is a cap (a policy without one reads as before)."""
        doc: dict[str, Any] = {
            "maxAttempts": self.max_attempts,
            "resubmitExpired": self.resubmit_expired,
            "pendingTimeoutHours": self.pending_timeout_hours,
        }
        if self.max_cost_usd is not None:
            doc["maxCostUSD"] = self.max_cost_usd
        return doc


def enabled(policy: RetryPolicy) -> bool:
    """Whether the policy asks for anything at all."""
    return (
        policy.max_attempts > 0
        or policy.resubmit_expired
        or policy.pending_timeout_hours is not None
    )


def parse_retry(raw: object, defaults: RetryPolicy) -> RetryPolicy:
    """The body's ``"retry"`` object: ``{"maxAttempts": 0..10, "resubmitExpired": bool,
    "pendingTimeoutHours": number in [1, 720] | null, "input": "s3://B/K" | "file:///ABS" |
    null, "maxCostUSD": number > 0 | null}``; a key left out takes its value from ``defaults``
    (``maxAttempts``: the default, or ``DEFAULT_ENABLED_ATTEMPTS`` when the default is 0: the
    object is the opt-in); an unknown key, a wrong type (a bool is not a number) or a value
    out of range is ``InvalidRetryError``."""
    if not isinstance(raw, Mapping):
        raise InvalidRetryError("'retry' must be a JSON object")
    unknown = sorted(str(key) for key in raw if key not in POLICY_KEYS)
    if unknown:
        raise InvalidRetryError(
            f"'retry' has unknown keys {unknown}; known: {', '.join(POLICY_KEYS)}"
        )
    max_attempts = defaults.max_attempts or DEFAULT_ENABLED_ATTEMPTS
    if "maxAttempts" in raw:
        max_attempts = _max_attempts(raw["maxAttempts"])
    resubmit = defaults.resubmit_expired
    if "resubmitExpired" in raw:
        value = raw["resubmitExpired"]
        if not isinstance(value, bool):
            raise InvalidRetryError(f"'retry.resubmitExpired' must be true or false, not {value!r}")
        resubmit = value
    timeout = defaults.pending_timeout_hours
    if "pendingTimeoutHours" in raw:
        timeout = _pending_timeout(raw["pendingTimeoutHours"])
    source = defaults.input
    if "input" in raw:
        source = None if raw["input"] is None else check_input_uri(raw["input"])
    cap = defaults.max_cost_usd
    if "maxCostUSD" in raw:
        cap = max_cost(raw["maxCostUSD"])
    return RetryPolicy(
        max_attempts=max_attempts,
        resubmit_expired=resubmit,
        pending_timeout_hours=timeout,
        input=source,
        max_cost_usd=cap,
    )


def max_cost(value: object) -> float | None:
    """``maxCostUSD``: a number of US dollars more than 0 (at most ``MAX_COST_USD``), or null
    (no cap); ``InvalidRetryError`` otherwise (a bool, text, NaN, infinity, 0 or less)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRetryError(
            f"'retry.maxCostUSD' must be a number of US dollars or null, not {value!r}"
        )
    dollars = float(value)
    if not math.isfinite(dollars) or not 0 < dollars <= MAX_COST_USD:
        raise InvalidRetryError(
            f"'retry.maxCostUSD' must be more than 0 and at most {MAX_COST_USD:.0f}, got {value!r}"
        )
    return dollars


def _max_attempts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRetryError(f"'retry.maxAttempts' must be an integer, not {value!r}")
    if not 0 <= value <= MAX_ATTEMPTS_LIMIT:
        raise InvalidRetryError(
            f"'retry.maxAttempts' must be between 0 and {MAX_ATTEMPTS_LIMIT}, got {value}"
        )
    return value


def _pending_timeout(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRetryError(
            f"'retry.pendingTimeoutHours' must be a number of hours or null, not {value!r}"
        )
    hours = float(value)
    if not math.isfinite(hours) or not 0 < hours <= MAX_PENDING_TIMEOUT_HOURS:
        raise InvalidRetryError(
            "'retry.pendingTimeoutHours' must be more than 0 and at most "
            f"{MAX_PENDING_TIMEOUT_HOURS:g}, got {value!r}"
        )
    if hours < MIN_PENDING_TIMEOUT_HOURS:
        raise InvalidRetryError(
            f"'retry.pendingTimeoutHours' must be at least {MIN_PENDING_TIMEOUT_HOURS:g}: opstate "
            "never cancels a batch younger than an hour (from Gemini's createTime), "
            f"got {value!r}"
        )
    return hours


def check_input_uri(value: object) -> str:
    """``s3://BUCKET/KEY`` (bucket of 3-63 ``[a-z0-9.-]``, a key) or ``file:///ABS/PATH`` (no
    ``..`` segment); no control characters; ``InvalidRetryError`` otherwise."""
    if not isinstance(value, str):
        raise InvalidRetryError(f"'retry.input' must be a string or null, not {value!r}")
    if len(value) > MAX_INPUT_URI_CHARS:
        raise InvalidRetryError(f"'retry.input' is longer than {MAX_INPUT_URI_CHARS} characters")
    if _CONTROL.search(value):
        raise InvalidRetryError("'retry.input' must not contain control characters")
    if value.startswith("s3://"):
        if _S3_URI.fullmatch(value) is None:
            raise InvalidRetryError(
                f"'retry.input' must be s3://BUCKET/KEY (bucket: 3-63 of a-z0-9.-), got {value!r}"
            )
        return value
    if value.startswith("file:///"):
        path = value[len("file://") :]
        if path == "/" or path.endswith("/") or ".." in path.split("/"):
            raise InvalidRetryError(
                f"'retry.input' must be file:///ABS/PATH of a file (no '..'), got {value!r}"
            )
        return value
    raise InvalidRetryError(
        f"'retry.input' must be s3://BUCKET/KEY or file:///ABS/PATH, got {value!r}"
    )


def parse_transient(text: str) -> dict[str, int | None]:
    """``OPSTATE_RETRY_TRANSIENT``: reason names from ``TRANSIENT_REASONS`` (any case),
    separated by commas, each with an optional ``:N`` (0-10: at most N retries of a key for that
    reason; None: as many as ``maxAttempts``), each name once; ``InvalidRetryError`` otherwise.
    (The settings run it at init, so a bad value fails there; the retry runner's
    ``opstate.retry.rules.parse_table`` reads the table with it too.)"""
    table: dict[str, int | None] = {}
    for entry in text.split(","):
        name, colon, limit = entry.partition(":")  # each part stripped below
        name = name.strip().upper()
        if name not in TRANSIENT_REASONS:
            raise InvalidRetryError(
                f"unknown transient reason {entry.strip()!r}; known: {', '.join(TRANSIENT_REASONS)}"
            )
        if name in table:
            raise InvalidRetryError(f"transient reason {name} is named twice")
        count: int | None = None
        if colon:
            limit = limit.strip()
            if _LIMIT.fullmatch(limit) is None or int(limit) > MAX_ATTEMPTS_LIMIT:
                raise InvalidRetryError(
                    f"{name}:N needs N between 0 and {MAX_ATTEMPTS_LIMIT}, got {limit!r}"
                )
            count = int(limit)
        table[name] = count
    return table


# -- views of a retry state's doc ---------------------------------------------------------------


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_member(doc: Mapping[str, Any]) -> bool:
    """Whether ``doc`` is a child's (it carries ``lineage``) rather than a root's."""
    return isinstance(doc.get("lineage"), Mapping)


def lineage_of(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``{"parent", "root", "attempt"}`` of the record ``name`` whose retry doc is ``doc``: a
    child's from its ``lineage``; a root is its own root, with no parent, attempt 0."""
    lineage = doc.get("lineage")
    if isinstance(lineage, Mapping):
        return {
            "parent": _text(lineage.get("parent")),
            "root": _text(lineage.get("root")),
            "attempt": _count(lineage.get("attempt")),
        }
    return {"parent": None, "root": name, "attempt": 0}


def policy_of(doc: Mapping[str, Any]) -> RetryPolicy:
    """The policy a retry state's ``doc`` keeps (``policy``; a value of the wrong type reads
    as the default: no retries, no resubmit, no timeout). Its ``input`` is kept apart."""
    policy = _map(doc.get("policy"))
    timeout = policy.get("pendingTimeoutHours")
    cap = policy.get("maxCostUSD")
    return RetryPolicy(
        max_attempts=_count(policy.get("maxAttempts")) or 0,
        resubmit_expired=policy.get("resubmitExpired") is True,
        pending_timeout_hours=timeout
        if isinstance(timeout, int | float) and not isinstance(timeout, bool)
        else None,
        max_cost_usd=float(cap)
        if isinstance(cap, int | float) and not isinstance(cap, bool) and cap > 0
        else None,
    )


def retry_view(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A root's ``retry`` in its view: ``{"policy", "status", "reason", "children", "input"}``.

    ``status``: ``final`` (final.jsonl written), ``stopped`` (the lineage stopped: a money
    refusal, or ``opstate retry --stop``), ``unavailable`` (retry cannot run: ``reason`` says
    why), ``off`` (the policy asks for nothing) or ``active``; a job's (``doc["job"]``, its
    plan) is ``final``, ``stopped`` (its plan's why as ``reason``), ``unavailable`` or
    ``active``, never ``off``: it feeds its parts whatever its retry policy.
    ``children``: ``{"name", "attempt", "rows", "phase"}`` each (``name`` null until Gemini
    created it; ``phase`` ``ended`` and ``state`` how it ended, EXPIRED for an expired batch,
    once the runner saw it terminal); ``input``: where opstate keeps the input (or null).
    """
    policy = policy_of(doc)
    stopped = _text(doc.get("stopped"))
    unavailable = _text(doc.get("unavailable"))
    if _map(doc.get("final")).get("status") == "final":
        status = "final"
    elif stopped is not None:
        status = "stopped"
    elif unavailable is not None:
        status = "unavailable"
    elif not enabled(policy):
        status = "off"
    else:
        status = "active"
    raw_children = doc.get("children")
    children = [
        _child_view(child)
        for child in (raw_children if isinstance(raw_children, list) else [])
        if isinstance(child, Mapping)
    ]
    view = {
        "policy": policy.as_doc(),
        "status": status,
        "reason": stopped if stopped is not None else unavailable,
        "children": children,
        "input": _text(_map(doc.get("input")).get("location")),
    }
    job = doc.get("job")
    if isinstance(job, Mapping):  # a job's record (issue 46): its parts, its policy, its input
        from opstate.domain.parts import job_view

        shown = job_view(job)
        why = (_text(shown["stopped"]) or "stopped") if "stopped" in shown else stopped
        if status != "final":  # a job feeds its parts whatever its retries: never "off"
            status = (
                "stopped"
                if why is not None
                else "unavailable"
                if unavailable is not None
                else "active"
            )
        view |= {
            "policy": policy_of(job).as_doc(),
            "status": status,
            "reason": why if status == "stopped" else view["reason"],
            "input": _text(_map(job.get("input")).get("location")),
            "job": shown,
        }
    return view


def _child_view(child: Mapping[str, Any]) -> dict[str, Any]:
    view = {
        "name": _text(child.get("name")),
        "attempt": _count(child.get("attempt")),
        "rows": _count(child.get("rows")),
        "phase": _text(child.get("phase")),
    }
    ended = _text(child.get("state"))
    if ended is not None:  # the runner saw the created child terminal: how it ended
        view |= {"phase": "ended", "state": ended}
    return view


def final_view(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A root's final result: ``{"status": "pending"|"final"|"unavailable", "location",
    "rows", "errors", "attempts"}`` (location, rows and errors null until known), and
    ``reason`` when ``unavailable`` (retry cannot run, so no final result will come: the
    root's own results are its answer). ``attempts``: the batches of the lineage (the root
    and its created children; the written count once final)."""
    final = _map(doc.get("final"))
    rows = final.get("rows")
    errors = final.get("errors")
    written = final.get("status") == "final"
    unavailable = _text(doc.get("unavailable"))
    view: dict[str, Any] = {
        "status": "final" if written else "unavailable" if unavailable else "pending",
        "location": _text(final.get("location")),
        "rows": dict(rows) if isinstance(rows, Mapping) else None,
        "errors": dict(errors) if isinstance(errors, Mapping) else None,
        "attempts": _count(final.get("attempts")) if written else len(lineage_names(doc, "")),
    }
    if unavailable and not written:
        view["reason"] = unavailable
    if written:
        view["cost"] = final_cost_view(final.get("cost"))
        view["stopped"] = _text(doc.get("stopped"))
    return view


def lineage_names(doc: Mapping[str, Any], name: str) -> list[str]:
    """The root ``name`` then its created children's names, in attempt order (then as planned)."""
    raw_children = doc.get("children")
    created = [
        (_count(child.get("attempt")) or 0, index, child["name"])
        for index, child in enumerate(raw_children if isinstance(raw_children, list) else [])
        if isinstance(child, Mapping) and isinstance(child.get("name"), str)
    ]
    return [name, *(child for _attempt, _index, child in sorted(created))]
