"""What test_retry_policy.py leaves to chance in opstate.domain.retry, pinned so that ``make
mutate`` kills it (issue 39): the input URI's length bound, the exact refusals, the policy as a
value, counts of the wrong type, the final view's reason."""

from __future__ import annotations

import dataclasses
import re

import pytest

from opstate.domain.retry import (
    InvalidRetryError,
    RetryPolicy,
    check_input_uri,
    final_view,
    lineage_names,
    lineage_of,
    parse_retry,
    parse_transient,
    policy_of,
)


def test_the_input_uri_may_be_2048_characters_not_more() -> None:
    prefix = "s3://bucket/"
    longest = prefix + "k" * (2048 - len(prefix))
    assert check_input_uri(longest) == longest
    with pytest.raises(InvalidRetryError, match=r"^'retry\.input' is longer than 2048 characters$"):
        check_input_uri(longest + "k")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: parse_retry([], RetryPolicy()), "'retry' must be a JSON object"),
        (
            lambda: check_input_uri("s3://b/k\x01"),
            "'retry.input' must not contain control characters",
        ),
        (
            lambda: check_input_uri("http://x/y"),
            "'retry.input' must be s3://BUCKET/KEY or file:///ABS/PATH, got 'http://x/y'",
        ),
        (
            lambda: parse_retry({"x": 1, "maxAttempts": 1}, RetryPolicy()),
            "'retry' has unknown keys ['x']; known: maxAttempts, resubmitExpired, "
            "pendingTimeoutHours, input, maxCostUSD",
        ),
        (
            lambda: parse_retry({"resubmitExpired": 1}, RetryPolicy()),
            "'retry.resubmitExpired' must be true or false, not 1",
        ),
        (
            lambda: parse_retry({"maxAttempts": "2"}, RetryPolicy()),
            "'retry.maxAttempts' must be an integer, not '2'",
        ),
        (
            lambda: parse_retry({"maxAttempts": 11}, RetryPolicy()),
            "'retry.maxAttempts' must be between 0 and 10, got 11",
        ),
        (
            lambda: parse_retry({"pendingTimeoutHours": "1"}, RetryPolicy()),
            "'retry.pendingTimeoutHours' must be a number of hours or null, not '1'",
        ),
        (
            lambda: parse_retry({"pendingTimeoutHours": 0}, RetryPolicy()),
            "'retry.pendingTimeoutHours' must be more than 0 and at most 720, got 0",
        ),
        (lambda: check_input_uri(3), "'retry.input' must be a string or null, not 3"),
        (
            lambda: check_input_uri("s3://B/k"),
            "'retry.input' must be s3://BUCKET/KEY (bucket: 3-63 of a-z0-9.-), got 's3://B/k'",
        ),
        (
            lambda: check_input_uri("file:///a/../b"),
            "'retry.input' must be file:///ABS/PATH of a file (no '..'), got 'file:///a/../b'",
        ),
        (
            lambda: parse_transient("NOPE"),
            "unknown transient reason 'NOPE'; known: RESOURCE_EXHAUSTED, UNAVAILABLE, "
            "INTERNAL, DEADLINE_EXCEEDED, ABORTED",
        ),
        (
            lambda: parse_transient("INTERNAL,internal"),
            "transient reason INTERNAL is named twice",
        ),
        (
            lambda: parse_transient("INTERNAL:11"),
            "INTERNAL:N needs N between 0 and 10, got '11'",
        ),
    ],
)
def test_the_refusals_say_exactly_what_is_wrong(call: object, message: str) -> None:
    with pytest.raises(InvalidRetryError, match="^" + re.escape(message) + "$"):
        call()  # type: ignore[operator]


def test_a_policy_is_a_value() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RetryPolicy().max_attempts = 3  # type: ignore[misc]


@pytest.mark.parametrize("bad", ["2", True, 2.0, None, [2]])
def test_counts_of_the_wrong_type_read_as_absent(bad: object) -> None:
    assert lineage_of({"lineage": {"attempt": bad}}, "n")["attempt"] is None
    assert policy_of({"policy": {"maxAttempts": bad}}).max_attempts == 0
    written = {"final": {"status": "final", "attempts": bad}}
    assert final_view(written)["attempts"] is None


def test_the_final_view_gives_a_reason_only_while_unavailable_and_not_written() -> None:
    view = final_view({"unavailable": "no input kept"})
    assert view["status"] == "unavailable" and view["reason"] == "no input kept"
    written = final_view({"unavailable": "no input kept", "final": {"status": "final"}})
    assert written["status"] == "final" and "reason" not in written
    assert "reason" not in final_view({})


def test_transient_names_and_limits_are_read_past_their_spaces() -> None:
    assert parse_transient("INTERNAL :1 , UNAVAILABLE") == {"INTERNAL": 1, "UNAVAILABLE": None}
    assert parse_transient("INTERNAL:1 ") == {"INTERNAL": 1}
    message = "unknown transient reason 'NOPE'; known: RESOURCE_EXHAUSTED, UNAVAILABLE, "
    message += "INTERNAL, DEADLINE_EXCEEDED, ABORTED"
    with pytest.raises(InvalidRetryError, match="^" + re.escape(message) + "$"):
        parse_transient("INTERNAL, NOPE ")


@pytest.mark.parametrize("bad", ["2", True, None, [1]])
def test_a_pending_timeout_of_the_wrong_type_reads_as_off(bad: object) -> None:
    assert policy_of({"policy": {"pendingTimeoutHours": bad}}).pending_timeout_hours is None
    assert policy_of({"policy": {"pendingTimeoutHours": 2}}).pending_timeout_hours == 2


def test_a_child_without_an_attempt_counts_as_attempt_0_in_the_lineage() -> None:
    doc = {
        "children": [
            {"name": "batches/second", "attempt": 1},
            {"name": "batches/first"},
            {"name": None, "attempt": 0},
        ]
    }
    assert lineage_names(doc, "batches/root") == [
        "batches/root",
        "batches/first",
        "batches/second",
    ]


def test_max_cost_takes_any_amount_above_0_up_to_its_cap() -> None:
    from opstate.domain.retry import MAX_COST_USD, InvalidRetryError, max_cost

    assert max_cost(0.5) == 0.5  # above 0, below a dollar
    assert max_cost(MAX_COST_USD) == MAX_COST_USD  # the cap itself
    with pytest.raises(InvalidRetryError) as bad:
        max_cost(True)
    assert str(bad.value) == ("'retry.maxCostUSD' must be a number of US dollars or null, not True")
    with pytest.raises(InvalidRetryError) as bad:
        max_cost(0)
    assert str(bad.value) == (
        "'retry.maxCostUSD' must be more than 0 and at most 1000000000, got 0"
    )


def test_a_kept_cap_is_read_back_only_above_0() -> None:
    from opstate.domain.retry import policy_of

    assert policy_of({"policy": {"maxCostUSD": 0.5}}).max_cost_usd == 0.5
    assert policy_of({"policy": {"maxCostUSD": 0}}).max_cost_usd is None


@pytest.mark.parametrize(
    ("doc", "status", "reason"),
    [
        # No policy at the top of a job's record: a lineage's view would say "off".
        ({}, "active", None),
        ({"job": {"stopped": True, "stoppedWhy": "money"}}, "stopped", "money"),
        ({"job": {"stopped": True, "stoppedWhy": 5}}, "stopped", "stopped"),
        ({"stopped": "by hand"}, "stopped", "by hand"),
        ({"unavailable": "no input"}, "unavailable", "no input"),
        ({"job": {"stopped": True}, "final": {"status": "final"}}, "final", None),
        ({"final": {"status": "final"}}, "final", None),
    ],
)
def test_a_jobs_status_is_its_own_never_off(
    doc: dict[str, object], status: str, reason: str | None
) -> None:
    """Issue 46: a job feeds its parts whatever its retry policy; its status reads its plan."""
    from opstate.domain.retry import retry_view

    plan = {"model": "m", "parts": [{"phase": "held", "rows": 1, "tokens": 4}]}
    raw_job = doc.get("job")
    job = plan | (raw_job if isinstance(raw_job, dict) else {})
    view = retry_view({k: v for k, v in doc.items() if k != "job"} | {"job": job})
    assert (view["status"], view["reason"]) == (status, reason)
    assert view["job"]["rows"] == 1
    if not doc:  # the same record without a plan: a lineage whose policy asks for nothing
        assert retry_view({})["status"] == "off"
