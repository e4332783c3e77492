"""Who asked opstate to act, and which inputs it may read for them (issue 38;
``opstate.retry.authority``, docs/security.md "Acting"): the provenance a policy is kept with,
what a policy of no provenance (the previous release's) may still do, the input prefixes and
their setting."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opstate.config import ConfigError, Settings
from opstate.domain.retry import RetryPolicy
from opstate.retry.authority import (
    VIA_API,
    VIA_CLI,
    VIA_SUBMIT,
    acting_policy,
    incoming_prefix,
    input_allowed,
    provenance,
    reads_input,
    withheld,
)
from opstate.retry.policy import attach_policy
from opstate.store.memory import MemoryStore
from tests.unit.test_retry_policy import NOW, _tracked

ASKS_ALL: dict[str, Any] = {
    "policy": {"maxAttempts": 2, "resubmitExpired": True, "pendingTimeoutHours": 3.0}
}
PREFIXES = ("s3://bucket/incoming/",)


@pytest.mark.parametrize("via", [VIA_API, VIA_CLI, VIA_SUBMIT])
def test_a_policy_with_a_provenance_acts_as_written(via: str) -> None:
    doc = ASKS_ALL | {"via": via}
    assert provenance(doc) == via
    assert acting_policy(doc) == RetryPolicy(2, True, 3.0)
    assert not withheld(doc)


@pytest.mark.parametrize("via", [None, "", "operator", 7])
def test_a_policy_without_one_retries_rows_but_resubmits_and_cancels_nothing(via: Any) -> None:
    doc = ASKS_ALL if via is None else ASKS_ALL | {"via": via}
    assert provenance(doc) is None
    assert acting_policy(doc) == RetryPolicy(2, False, None)
    assert withheld(doc)
    # a policy that asks only for row retries loses nothing
    assert not withheld({"policy": {"maxAttempts": 2}})


def test_attach_records_who_attached_and_refuses_an_unknown_one() -> None:
    store = MemoryStore()
    record = _tracked(store)
    for via in (VIA_API, VIA_SUBMIT, VIA_CLI):
        written = attach_policy(store, record, RetryPolicy(1), model=None, now_ns=NOW, via=via)
        assert written is not None and written.doc["via"] == via  # the last attach's
    with pytest.raises(ValueError, match="unknown provenance"):
        attach_policy(store, record, RetryPolicy(1), model=None, now_ns=NOW, via="webhook")


@pytest.mark.parametrize(
    ("uri", "allowed"),
    [
        ("s3://bucket/incoming/in.jsonl", True),
        ("s3://bucket/incoming/a/b/in.jsonl", True),
        ("s3://bucket/incoming/", False),  # no object
        ("s3://bucket/incoming-other/in.jsonl", False),
        ("s3://bucket/results/inputs/ab/input.jsonl", False),  # someone's kept prompts
        ("s3://bucket/incoming/../results/x.jsonl", False),
        ("s3://bucket/incoming/./x.jsonl", False),
        ("s3://bucket/incoming//x.jsonl", False),
        ("s3://other/incoming/in.jsonl", False),
        ("s3://bucket/incoming/in.jsonl?versionId=1", False),
        ("file:///etc/passwd", False),
        ("https://bucket/incoming/in.jsonl", False),
    ],
)
def test_an_input_is_allowed_only_under_a_prefix(uri: str, allowed: bool) -> None:
    assert input_allowed(uri, PREFIXES) is allowed
    assert input_allowed(uri, ()) is False  # no prefixes: nothing


@given(
    st.lists(
        st.sampled_from(["incoming", "results", "a", ".", "..", "", "%2e", "%2E", "%2f", ".%2e"]),
        min_size=1,
        max_size=6,
    )
)
def test_an_allowed_input_is_under_the_prefix_as_the_reader_reads_it(parts: list[str]) -> None:
    """Issue 47: the check runs on the key as ``source_chunks`` reads it (percent-decoded):
    any key it allows reads, decoded, under the prefix without a ``.``, ``..`` or empty
    segment."""
    uri = "s3://bucket/" + "/".join(parts)
    if input_allowed(uri, PREFIXES):
        read = unquote(uri.removeprefix("s3://bucket/"))
        assert read.startswith("incoming/")
        assert all(part not in ("", ".", "..") for part in read.split("/"))


def test_what_the_retry_pass_reads_depends_on_who_named_the_input() -> None:
    outside = "s3://bucket/results/inputs/ab/input.jsonl"
    for via in (VIA_CLI, VIA_SUBMIT):  # the operator names any input
        assert reads_input({"via": via}, outside, PREFIXES)
    assert not reads_input({"via": VIA_API}, outside, PREFIXES)
    assert reads_input({"via": VIA_API}, "s3://bucket/incoming/a.jsonl", PREFIXES)
    assert not reads_input({"via": VIA_API}, "file:///in.jsonl", PREFIXES)
    # the previous release's: its API refused file://, so a file:// is its CLI's
    assert reads_input({}, "file:///in.jsonl", PREFIXES)
    assert not reads_input({}, outside, PREFIXES)
    assert reads_input({}, "s3://bucket/incoming/a.jsonl", PREFIXES)


def test_the_submit_functions_prefix_is_the_results_buckets_incoming() -> None:
    assert incoming_prefix("s3://my-results/results") == "s3://my-results/incoming/"
    assert incoming_prefix("file:///tmp/results") is None
    assert incoming_prefix(None) is None


def test_the_prefixes_setting_is_normalised_and_checked() -> None:
    read = Settings.from_env(
        {"OPSTATE_RETRY_INPUT_PREFIXES": " s3://bk1/incoming , s3://bk2/, s3://bk1/incoming/"}
    )
    assert read.retry_input_prefixes == ("s3://bk1/incoming/", "s3://bk2/")
    assert Settings.from_env({}).retry_input_prefixes == ()
    for bad in ("file:///in/", "s3://B/x/", "s3://bk1/../x/", "s3://bk1//", "incoming/"):
        with pytest.raises(ConfigError, match="OPSTATE_RETRY_INPUT_PREFIXES"):
            Settings.from_env({"OPSTATE_RETRY_INPUT_PREFIXES": bad})


def test_the_retry_token_is_strong_and_not_the_api_token() -> None:
    token = "r" * 32
    assert Settings.from_env({"OPSTATE_RETRY_API_TOKEN": token}).retry_api_token == token
    with pytest.raises(ConfigError, match="at least 32 characters"):
        Settings.from_env({"OPSTATE_RETRY_API_TOKEN": "short"})
    with pytest.raises(ConfigError, match="must differ from OPSTATE_API_TOKEN"):
        Settings.from_env({"OPSTATE_RETRY_API_TOKEN": token, "OPSTATE_API_TOKEN": token})
    assert Settings.from_env({"OPSTATE_RETRY_OVER_API": "true"}).retry_over_api is True
    assert Settings().retry_over_api is False and Settings().retry_api_token is None
