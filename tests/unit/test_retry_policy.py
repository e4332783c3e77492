"""Retry policies (issue 33): the ``"retry"`` object and the transient table read strictly
(each kind of bad value refused with its reason), the settings' default policy, the views of a
retry state's doc, and ``attach_policy`` keeping a root's state beside its record."""

from __future__ import annotations

from typing import Any

import pytest

from opstate.config import (
    DEFAULT_RETRY_TRANSIENT,
    MAX_RETRY_ATTEMPTS,
    ConfigError,
    RetrySettings,
    Settings,
)
from opstate.domain.costs import REASON_FINAL_PREVIOUS_RELEASE
from opstate.domain.model import OpRecord
from opstate.domain.retry import (
    DEFAULT_ENABLED_ATTEMPTS,
    MAX_ATTEMPTS_LIMIT,
    InvalidRetryError,
    RetryPolicy,
    enabled,
    final_view,
    lineage_names,
    lineage_of,
    parse_retry,
    parse_transient,
    policy_of,
    retry_view,
)
from opstate.domain.states import State
from opstate.retry.authority import VIA_CLI
from opstate.retry.policy import attach_policy, settings_policy
from opstate.store import MemoryStore
from opstate.store.port import StoreUnavailableError
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RETRY_MEMBER, RetryState

OFF = RetryPolicy()
NOW = 1_700_000_000_000_000_000


# -- parse_retry --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ([], "must be a JSON object"),
        ("maxAttempts=2", "must be a JSON object"),
        ({"maxAttempts": 2, "retries": 3}, "unknown keys \\['retries'\\]"),
        ({"maxAttempts": True}, "maxAttempts' must be an integer"),
        ({"maxAttempts": 2.0}, "maxAttempts' must be an integer"),
        ({"maxAttempts": "2"}, "maxAttempts' must be an integer"),
        ({"maxAttempts": None}, "maxAttempts' must be an integer"),
        ({"maxAttempts": -1}, "between 0 and 10"),
        ({"maxAttempts": 11}, "between 0 and 10"),
        ({"resubmitExpired": 1}, "resubmitExpired' must be true or false"),
        ({"resubmitExpired": "true"}, "resubmitExpired' must be true or false"),
        ({"resubmitExpired": None}, "resubmitExpired' must be true or false"),
        ({"pendingTimeoutHours": True}, "pendingTimeoutHours' must be a number"),
        ({"pendingTimeoutHours": "24"}, "pendingTimeoutHours' must be a number"),
        ({"pendingTimeoutHours": 0}, "more than 0 and at most 720"),
        ({"pendingTimeoutHours": -3}, "more than 0 and at most 720"),
        ({"pendingTimeoutHours": 720.5}, "more than 0 and at most 720"),
        # issue 38: never a cancel of a batch younger than an hour (from Gemini's createTime)
        ({"pendingTimeoutHours": 0.5}, "must be at least 1: opstate never cancels"),
        ({"pendingTimeoutHours": 1e-9}, "must be at least 1: opstate never cancels"),
        ({"pendingTimeoutHours": float("nan")}, "more than 0 and at most 720"),
        ({"pendingTimeoutHours": float("inf")}, "more than 0 and at most 720"),
        ({"maxCostUSD": True}, "maxCostUSD' must be a number of US dollars or null"),
        ({"maxCostUSD": "1.5"}, "maxCostUSD' must be a number of US dollars or null"),
        ({"maxCostUSD": 0}, "maxCostUSD' must be more than 0"),
        ({"maxCostUSD": -0.01}, "maxCostUSD' must be more than 0"),
        ({"maxCostUSD": float("nan")}, "maxCostUSD' must be more than 0"),
        ({"maxCostUSD": float("inf")}, "maxCostUSD' must be more than 0"),
        ({"maxCostUSD": 1e10}, "maxCostUSD' must be more than 0"),
        ({"input": 7}, "input' must be a string or null"),
        ({"input": "https://example.com/in.jsonl"}, "s3://BUCKET/KEY or file:///ABS/PATH"),
        ({"input": "file://relative/in.jsonl"}, "s3://BUCKET/KEY or file:///ABS/PATH"),
        ({"input": "s3://bucket"}, "must be s3://BUCKET/KEY"),
        ({"input": "s3://bucket/"}, "must be s3://BUCKET/KEY"),
        ({"input": "s3://ab/key"}, "must be s3://BUCKET/KEY"),
        ({"input": "s3://My_Bucket/key"}, "must be s3://BUCKET/KEY"),
        ({"input": "s3://" + "b" * 64 + "/key"}, "must be s3://BUCKET/KEY"),
        ({"input": "file:///"}, "file:///ABS/PATH of a file"),
        ({"input": "file:///data/"}, "file:///ABS/PATH of a file"),
        ({"input": "file:///data/../etc/passwd"}, "no '..'"),
        ({"input": "s3://bucket/key\nx"}, "control characters"),
        ({"input": "s3://bucket/" + "k" * 2048}, "longer than 2048"),
    ],
)
def test_a_bad_retry_object_is_refused_with_its_reason(raw: object, reason: str) -> None:
    with pytest.raises(InvalidRetryError, match=reason):
        parse_retry(raw, OFF)


def test_missing_keys_take_the_defaults_and_given_ones_win() -> None:
    defaults = RetryPolicy(max_attempts=2, resubmit_expired=True)
    assert parse_retry({}, defaults) == defaults
    assert parse_retry({"maxAttempts": 0}, defaults) == RetryPolicy(0, True, None, None)
    parsed = parse_retry(
        {
            "maxAttempts": 10,
            "resubmitExpired": False,
            "pendingTimeoutHours": 720,
            "input": "s3://my-bucket.eu/in/batch 1.jsonl",
        },
        defaults,
    )
    assert parsed == RetryPolicy(10, False, 720.0, "s3://my-bucket.eu/in/batch 1.jsonl")
    assert isinstance(parsed.pending_timeout_hours, float)
    assert parse_retry({"pendingTimeoutHours": 1, "input": None}, OFF).pending_timeout_hours == 1.0
    assert parse_retry({"input": "file:///data/in.jsonl"}, OFF).input == "file:///data/in.jsonl"
    # null switches the timeout (and the input) off even when the default has one; a retry
    # object that leaves maxAttempts out while the default is 0 is the opt-in: 2 retries
    timed = RetryPolicy(pending_timeout_hours=5.0, input="s3://abc/k")
    assert parse_retry({"pendingTimeoutHours": None, "input": None}, timed) == RetryPolicy(2)
    assert parse_retry({}, OFF) == RetryPolicy(DEFAULT_ENABLED_ATTEMPTS)
    assert parse_retry({"resubmitExpired": True}, OFF) == RetryPolicy(2, True)
    assert parse_retry({"maxAttempts": 0, "resubmitExpired": True}, OFF) == RetryPolicy(0, True)


def test_enabled_and_the_policy_map() -> None:
    assert not enabled(OFF)
    assert not enabled(RetryPolicy(input="s3://abc/k"))  # an input alone asks for nothing
    assert enabled(RetryPolicy(max_attempts=1))
    assert enabled(RetryPolicy(resubmit_expired=True))
    assert enabled(RetryPolicy(pending_timeout_hours=1.0))
    assert RetryPolicy(2, True, 6.0, "s3://abc/k").as_doc() == {
        "maxAttempts": 2,
        "resubmitExpired": True,
        "pendingTimeoutHours": 6.0,
    }


# -- the transient table and the settings -------------------------------------------------------


def test_the_default_transient_table() -> None:
    # the settings own the default and the bound; the pure parser reads them alike
    assert MAX_RETRY_ATTEMPTS == MAX_ATTEMPTS_LIMIT
    assert parse_transient(DEFAULT_RETRY_TRANSIENT) == {
        "RESOURCE_EXHAUSTED": None,
        "UNAVAILABLE": None,
        "INTERNAL": 1,
        "DEADLINE_EXCEEDED": 1,
    }
    assert parse_transient(" ABORTED:3 , unavailable ") == {"ABORTED": 3, "UNAVAILABLE": None}
    assert parse_transient("internal:0,Deadline_Exceeded:10") == {
        "INTERNAL": 0,
        "DEADLINE_EXCEEDED": 10,
    }


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "unknown transient reason ''"),
        ("UNAVAILABLE,", "unknown transient reason ''"),
        ("UNAVAILABLE,,INTERNAL", "unknown transient reason ''"),
        ("PERMISSION_DENIED", "unknown transient reason 'PERMISSION_DENIED'"),
        ("INTERNAL:11", "between 0 and 10"),
        ("INTERNAL:x", "between 0 and 10"),
        ("INTERNAL:", "between 0 and 10"),
        ("INTERNAL:-1", "between 0 and 10"),
        ("INTERNAL:1.5", "between 0 and 10"),
        ("INTERNAL,internal:1", "named twice"),
    ],
)
def test_a_bad_transient_table_is_refused(text: str, reason: str) -> None:
    with pytest.raises(InvalidRetryError, match=reason):
        parse_transient(text)


def test_the_retry_settings_and_their_default_policy() -> None:
    defaults = Settings.from_env({})
    assert (defaults.retry_max_attempts, defaults.retry_resubmit_expired) == (0, False)
    assert (defaults.retry_max_rows, defaults.retry_max_batches) == (50_000, 10)
    assert defaults.retry_transient == DEFAULT_RETRY_TRANSIENT
    assert (defaults.retry_check_s, defaults.retry_lease_s) == (60.0, 900.0)
    assert settings_policy(defaults) == OFF
    env = {
        "OPSTATE_RETRY_MAX_ATTEMPTS": "3",
        "OPSTATE_RETRY_RESUBMIT_EXPIRED": "true",
        "OPSTATE_RETRY_MAX_ROWS": "1000",
        "OPSTATE_RETRY_MAX_BATCHES": "100",
        "OPSTATE_RETRY_TRANSIENT": "UNAVAILABLE",
        "OPSTATE_RETRY_CHECK_SECONDS": "5",
        "OPSTATE_RETRY_LEASE_SECONDS": "120",
    }
    read = RetrySettings.from_env(env)
    assert read == RetrySettings(
        retry_max_attempts=3,
        retry_resubmit_expired=True,
        retry_max_rows=1000,
        retry_max_batches=100,
        retry_transient="UNAVAILABLE",
        retry_check_s=5.0,
        retry_lease_s=120.0,
    )
    assert settings_policy(Settings.from_env(env)) == RetryPolicy(3, True, None, None)
    assert not RetrySettings.from_env(
        {"OPSTATE_RETRY_RESUBMIT_EXPIRED": "False"}
    ).retry_resubmit_expired


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("OPSTATE_RETRY_MAX_ATTEMPTS", "11"),
        ("OPSTATE_RETRY_MAX_ATTEMPTS", "-1"),
        ("OPSTATE_RETRY_MAX_ATTEMPTS", "two"),
        ("OPSTATE_RETRY_RESUBMIT_EXPIRED", "maybe"),
        ("OPSTATE_RETRY_MAX_ROWS", "0"),
        ("OPSTATE_RETRY_MAX_ROWS", "2000001"),
        ("OPSTATE_RETRY_MAX_BATCHES", "0"),
        ("OPSTATE_RETRY_MAX_BATCHES", "101"),
        ("OPSTATE_RETRY_TRANSIENT", "INTERNAL:11"),
        ("OPSTATE_RETRY_TRANSIENT", "NOT_FOUND"),
        ("OPSTATE_RETRY_CHECK_SECONDS", "0"),
        ("OPSTATE_RETRY_LEASE_SECONDS", "901"),
        ("OPSTATE_RETRY_MAX_COST_USD", "0"),
        ("OPSTATE_RETRY_MAX_COST_USD", "-1"),
        ("OPSTATE_RETRY_MAX_COST_USD", "nan"),
        ("OPSTATE_RETRY_MAX_COST_USD", "five"),
        ("OPSTATE_RETRY_DAILY_BUDGET_USD", "inf"),
        ("OPSTATE_RETRY_DAILY_BUDGET_USD", "0"),
    ],
)
def test_a_bad_retry_setting_names_its_variable(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        Settings.from_env({key: value})


def test_max_cost_usd_is_kept_only_when_given_and_the_deployment_default_fills_it() -> None:
    plain = parse_retry({"maxAttempts": 2}, RetryPolicy())
    assert plain.max_cost_usd is None and "maxCostUSD" not in plain.as_doc()
    capped = parse_retry({"maxAttempts": 2, "maxCostUSD": 12.5}, RetryPolicy())
    assert capped.as_doc()["maxCostUSD"] == 12.5
    assert policy_of({"policy": capped.as_doc()}).max_cost_usd == 12.5
    config = Settings.from_env({"OPSTATE_RETRY_MAX_COST_USD": "3"})
    assert config.retry_max_cost_usd == 3.0 and config.retry_daily_budget_usd is None
    assert parse_retry({}, settings_policy(config)).max_cost_usd == 3.0
    assert parse_retry({"maxCostUSD": None}, settings_policy(config)).max_cost_usd is None
    assert Settings.from_env({}).retry_max_cost_usd is None  # unset by default


# -- views ---------------------------------------------------------------------------------------

ROOT_DOC: dict[str, Any] = {
    "policy": {"maxAttempts": 2, "resubmitExpired": False, "pendingTimeoutHours": None},
    "model": "models/gemini-2.5-flash",
    "input": {"source": "s3://in-bucket/a.jsonl", "location": "s3://res/inputs/ab/input.jsonl"},
    "unavailable": None,
    "stopped": None,
    "children": [
        {"id": "opstate-x-a2-0", "attempt": 2, "name": "batches/c2", "rows": 1, "phase": "created"},
        {"id": "opstate-x-a1-0", "attempt": 1, "name": "batches/c1", "rows": 4, "phase": "created"},
        {"id": "opstate-x-a2-1", "attempt": 2, "name": None, "rows": 2, "phase": "planned"},
    ],
    "final": {
        "status": "final",
        "location": "s3://res/batches/root/final.jsonl",
        "rows": {"total": 10, "answered": 9, "blocked": 0, "failed": 1},
        "errors": {"400": 1},
        "retried": 5,
        "attempts": 3,
    },
}


def test_the_views_of_a_root() -> None:
    assert lineage_of(ROOT_DOC, "batches/root") == {
        "parent": None,
        "root": "batches/root",
        "attempt": 0,
    }
    view = retry_view(ROOT_DOC)
    assert view == {
        "policy": {"maxAttempts": 2, "resubmitExpired": False, "pendingTimeoutHours": None},
        "status": "final",
        "reason": None,
        "children": [
            {"name": "batches/c2", "attempt": 2, "rows": 1, "phase": "created"},
            {"name": "batches/c1", "attempt": 1, "rows": 4, "phase": "created"},
            {"name": None, "attempt": 2, "rows": 2, "phase": "planned"},
        ],
        "input": "s3://res/inputs/ab/input.jsonl",
    }
    assert final_view(ROOT_DOC) == {
        "status": "final",
        "location": "s3://res/batches/root/final.jsonl",
        "rows": {"total": 10, "answered": 9, "blocked": 0, "failed": 1},
        "errors": {"400": 1},
        "attempts": 3,
        # a final result written without a cost (an earlier release's): unknown, never 0
        "cost": {
            "usd": None,
            "retries_usd": None,
            "model": None,
            "prices": None,
            "batch_discount": None,
            "reason": REASON_FINAL_PREVIOUS_RELEASE,
        },
        "stopped": None,
    }
    assert lineage_names(ROOT_DOC, "batches/root") == ["batches/root", "batches/c1", "batches/c2"]


@pytest.mark.parametrize(
    ("changes", "status", "reason"),
    [
        ({"final": {"status": "pending"}}, "active", None),
        ({"final": None, "stopped": "quota refused"}, "stopped", "quota refused"),
        ({"final": None, "unavailable": "no input held"}, "unavailable", "no input held"),
        ({"final": None, "policy": {"maxAttempts": 0, "resubmitExpired": False}}, "off", None),
        ({"final": None, "policy": {"maxAttempts": 0, "pendingTimeoutHours": 3}}, "active", None),
    ],
)
def test_the_status_of_a_root(changes: dict[str, Any], status: str, reason: str | None) -> None:
    view = retry_view(ROOT_DOC | changes)
    assert (view["status"], view["reason"]) == (status, reason)


def test_a_child_and_a_malformed_doc_read_tolerantly() -> None:
    child = {"lineage": {"root": "batches/r", "parent": "batches/p", "attempt": 2, "id": "o"}}
    assert lineage_of(child, "batches/c") == {
        "parent": "batches/p",
        "root": "batches/r",
        "attempt": 2,
    }
    odd: dict[str, Any] = {"policy": [], "children": {"x": 1}, "input": "s3://x/y", "final": 7}
    assert retry_view(odd) == {
        "policy": {"maxAttempts": 0, "resubmitExpired": False, "pendingTimeoutHours": None},
        "status": "off",
        "reason": None,
        "children": [],
        "input": None,
    }
    assert final_view({}) == {
        "status": "pending",
        "location": None,
        "rows": None,
        "errors": None,
        "attempts": 1,  # pending: the batches of the lineage so far (the root alone)
    }
    assert lineage_names(odd, "batches/r") == ["batches/r"]


# -- attach_policy ------------------------------------------------------------------------------


def _tracked(store: MemoryStore, name: str = "batches/root") -> OpRecord:
    record = OpRecord(name, State.PENDING, NOW, 1, "report", {}, created_ns=NOW, applied_ns=NOW)
    assert store.put_if_absent(record).ok
    return record


def test_an_enabled_policy_is_kept_active_and_due_now() -> None:
    store = MemoryStore()
    record = _tracked(store)
    policy = RetryPolicy(2, False, 12.0, "s3://in-bucket/a.jsonl")
    written = attach_policy(store, record, policy, model="models/m", now_ns=NOW + 5, via=VIA_CLI)
    assert written is not None and written == store.get_retry(record.name)
    assert (written.status, written.rev, written.due_ns) == (RETRY_ACTIVE, 1, NOW + 5)
    assert written.created_ns == NOW
    doc = written.doc
    assert doc["policy"] == policy.as_doc() and doc["model"] == "models/m"
    assert doc["via"] == VIA_CLI  # who attached it (issue 38): the engine reads it
    assert doc["input"]["source"] == "s3://in-bucket/a.jsonl"
    assert doc["input"]["location"] is None
    assert doc["children"] == [] and doc["final"]["status"] == "pending"
    assert store.get(record.name) == record  # the record itself is untouched


def test_a_policy_again_keeps_children_final_and_the_kept_input() -> None:
    store = MemoryStore()
    record = _tracked(store)
    doc = dict(ROOT_DOC) | {"unavailable": "no input held"}
    state = RetryState(RETRY_DONE, created_ns=NOW, due_ns=0, doc=doc)
    assert store.set_retry(record.name, 0, state)
    kept = {"location": "file:///r/inputs/ff/input.jsonl", "sha256": "ff", "rows": 10, "bytes": 99}
    again = attach_policy(
        store,
        record,
        RetryPolicy(max_attempts=3),
        model=None,
        now_ns=NOW,
        via=VIA_CLI,
        kept_input=kept,
    )
    assert again is not None and again.rev == 2 and again.status == RETRY_ACTIVE
    assert again.doc["children"] == ROOT_DOC["children"]
    assert again.doc["final"] == ROOT_DOC["final"]
    assert again.doc["model"] == "models/gemini-2.5-flash"  # no model given: the kept one
    assert again.doc["input"] == {"source": "s3://in-bucket/a.jsonl", **kept}
    assert again.doc["unavailable"] is None  # the runner judges again
    assert again.doc["policy"]["maxAttempts"] == 3
    # switched off: kept, done, the policy shown off
    off = attach_policy(store, record, OFF, model=None, now_ns=NOW, via=VIA_CLI)
    assert off is not None and off.status == RETRY_DONE and off.due_ns == 0
    assert retry_view(off.doc)["policy"]["maxAttempts"] == 0


def test_another_input_named_drops_the_copy_of_the_old_one() -> None:
    """A kept copy belongs to its source: naming another input leaves the copying of it to the
    runner (the old copy would otherwise stand for the new input)."""
    store = MemoryStore()
    record = _tracked(store)
    kept = {"location": "file:///r/inputs/ff/input.jsonl", "sha256": "ff", "rows": 10, "bytes": 99}
    first = attach_policy(
        store,
        record,
        RetryPolicy(1, input="s3://in-bucket/a.jsonl"),
        model=None,
        now_ns=NOW,
        via=VIA_CLI,
        kept_input=kept,
    )
    assert first is not None and first.doc["input"]["location"] == kept["location"]
    same = attach_policy(store, record, RetryPolicy(2), model=None, now_ns=NOW, via=VIA_CLI)
    assert same is not None and same.doc["input"]["location"] == kept["location"]
    other = attach_policy(
        store,
        record,
        RetryPolicy(2, input="s3://in-bucket/b.jsonl"),
        model=None,
        now_ns=NOW,
        via=VIA_CLI,
    )
    assert other is not None
    assert other.doc["input"] == dict.fromkeys(("location", "sha256", "rows", "bytes")) | {
        "source": "s3://in-bucket/b.jsonl"
    }


def test_a_kept_input_without_a_policy_is_remembered_off() -> None:
    """opstate submit without a flag: the input is named beside the record, retries off."""
    store = MemoryStore()
    record = _tracked(store)
    kept = {"location": "file:///r/inputs/ff/input.jsonl", "sha256": "ff", "rows": 10, "bytes": 99}
    written = attach_policy(store, record, OFF, model="m", now_ns=NOW, via=VIA_CLI, kept_input=kept)
    assert written is not None and (written.status, written.due_ns) == (RETRY_DONE, 0)
    assert written.doc["input"] == {"source": None, **kept}
    assert retry_view(written.doc)["status"] == "off"


def test_no_policy_and_no_state_writes_nothing() -> None:
    store = MemoryStore()
    record = _tracked(store)
    assert attach_policy(store, record, OFF, model=None, now_ns=NOW, via=VIA_CLI) is None
    assert store.get_retry(record.name) is None


def test_a_child_takes_its_roots_policy() -> None:
    store = MemoryStore()
    record = _tracked(store, "batches/child")
    lineage = {"lineage": {"root": "batches/root", "parent": "batches/root", "attempt": 1}}
    assert store.set_retry(record.name, 0, RetryState(RETRY_MEMBER, created_ns=NOW, doc=lineage))
    with pytest.raises(ValueError, match="a retry child takes its root's policy"):
        attach_policy(
            store, record, RetryPolicy(max_attempts=1), model=None, now_ns=NOW, via=VIA_CLI
        )
    assert store.get_retry(record.name) is not None
    assert store.get_retry(record.name).doc == lineage  # type: ignore[union-attr]


class RacingStore(MemoryStore):
    """A store where another writer wins the first ``losses`` retry writes."""

    def __init__(self, losses: int) -> None:
        super().__init__()
        self.losses = losses
        self.tries = 0

    def set_retry(self, name: str, expected_rev: int, state: RetryState) -> bool:
        self.tries += 1
        if self.losses > 0:
            self.losses -= 1
            rival = RetryState(RETRY_DONE, created_ns=state.created_ns, doc={"rival": True})
            assert super().set_retry(name, expected_rev, rival)
            return False
        return super().set_retry(name, expected_rev, state)


def test_a_lost_race_is_read_again_and_retried_five_times_at_most() -> None:
    store = RacingStore(losses=4)
    record = _tracked(store)
    written = attach_policy(
        store, record, RetryPolicy(max_attempts=1), model=None, now_ns=NOW, via=VIA_CLI
    )
    assert written is not None and written.rev == 5 and store.tries == 5
    assert written.doc["rival"] is True  # built on what the other writer left
    busy = RacingStore(losses=5)
    record = _tracked(busy)
    with pytest.raises(StoreUnavailableError, match="5 writes in a row"):
        attach_policy(
            busy, record, RetryPolicy(max_attempts=1), model=None, now_ns=NOW, via=VIA_CLI
        )
    assert busy.tries == 5
