"""Reports from the user's own producer (``from_report``): the one source whose details are
checked strictly (``details.check``: what no store can hold is ``invalid-details``). Pure;
``opstate.domain.events`` re-exports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opstate.domain.details import InvalidDetailsError
from opstate.domain.details import check as check_details
from opstate.domain.events_parsing import (
    UNKNOWN_STATE,
    InvalidEventError,
    Source,
    UnsupportedEventError,
    check_future_skew,
    event_time,
    parsed_name,
    with_model,
)
from opstate.domain.model import OpEvent
from opstate.domain.names import Kind
from opstate.domain.states import State, UnknownStateError, parse_state


def from_report(
    name: object,
    body: Mapping[str, Any] | None,
    *,
    now_ns: int,
    kind_hint: Kind | None = None,
    max_future_skew_s: float | None = None,
) -> OpEvent:
    """A report from the user's own producer: optional ``{"state", "updateTime", "details"}``.

    No body (or no ``state``) means "track this job": PENDING. No ``updateTime`` means
    ``now_ns``, which the caller reads from its clock (this module reads none). With
    ``max_future_skew_s``, an ``updateTime`` more than that ahead of ``now_ns`` is
    ``invalid-time`` (``check_future_skew``).
    """
    parsed = parsed_name(name, kind_hint)
    if body is None:
        body = {}
    if not isinstance(body, Mapping):
        raise InvalidEventError("invalid-body", "the report body must be a JSON object")
    raw_state = body.get("state")
    if raw_state is None:
        state = State.PENDING
    elif not isinstance(raw_state, str):
        raise InvalidEventError("invalid-state", f"'state' must be a string, not {raw_state!r}")
    else:
        try:
            state = parse_state(raw_state)
        except UnknownStateError as exc:
            raise UnsupportedEventError(UNKNOWN_STATE, str(exc)) from None
    raw_time = body.get("updateTime")
    update_ns = now_ns if raw_time is None else event_time(raw_time)
    details = body.get("details")
    if details is None:
        details = {}
    if not isinstance(details, Mapping):
        raise InvalidEventError("invalid-details", "'details' must be a JSON object")
    try:
        checked = check_details(details)
    except InvalidDetailsError as exc:
        raise InvalidEventError("invalid-details", str(exc)) from None
    event = OpEvent(parsed.key, state, update_ns, Source.REPORT, with_model(checked, parsed))
    if max_future_skew_s is None:
        return event
    return check_future_skew(event, now_ns=now_ns, max_skew_s=max_future_skew_s)
