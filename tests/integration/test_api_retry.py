"""``PUT /operations/{name}`` with a ``"retry"`` policy and the record view of a retry root, a
retry child and a record of the previous release, over the SQLite store (issue 33;
docs/retry.md): an invalid policy is 400 ``invalid-retry`` with nothing written, a valid one is
kept beside the record (active, due now), a store fault is the usual 503, and records without a
retry state look exactly as before."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from opstate.api import create_app
from opstate.config import Settings
from opstate.domain.retry import retry_view
from opstate.domain.views import record_to_json
from opstate.signatures import StaticSecretsVerifier
from opstate.store.port import ArchiveState, StoreUnavailableError
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RETRY_MEMBER, RetryState
from opstate.store.sqlite import SQLiteStore
from tests.support.webhooks import EVENT_TIMESTAMP, TEST_SECRET, operation_event

NAME = "batches/root-1"
NOW = 1_780_000_000_000_000_000
# A deployment whose operator granted the retry right over the API and named the prefix its
# inputs may come from (docs/security.md, "Acting"): what these tests' policies need.
GRANTED: dict[str, Any] = {"retry_over_api": True, "retry_input_prefixes": ("s3://in-bucket/",)}
SETTINGS = Settings(retry_max_attempts=2, retry_resubmit_expired=False, **GRANTED)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    opened = SQLiteStore(tmp_path / "ops.db")
    yield opened
    opened.close()


def _app(store: SQLiteStore, settings: Settings = SETTINGS) -> Any:
    return create_app(
        store=store,
        verifier=StaticSecretsVerifier([TEST_SECRET], clock_s=lambda: EVENT_TIMESTAMP),
        settings=settings,
        clock_ns=lambda: NOW,
    )


def _put(app: Any, body: Mapping[str, Any] | None, name: str = NAME) -> tuple[int, Any]:
    raw = b"" if body is None else json.dumps(body).encode()
    answer = app.resolve(operation_event("PUT", name, raw), None)
    return answer["statusCode"], json.loads(answer["body"])


def _get(app: Any, name: str = NAME) -> tuple[int, Any]:
    answer = app.resolve(operation_event("GET", name), None)
    return answer["statusCode"], json.loads(answer["body"])


@pytest.mark.parametrize(
    ("retry", "message"),
    [
        ("yes", "'retry' must be a JSON object"),
        ({"maxAttempts": 2, "maxRetries": 1}, "unknown keys ['maxRetries']"),
        ({"maxAttempts": True}, "'retry.maxAttempts' must be an integer"),
        ({"maxAttempts": 11}, "between 0 and 10"),
        ({"resubmitExpired": "no"}, "'retry.resubmitExpired' must be true or false"),
        ({"pendingTimeoutHours": 0}, "more than 0 and at most 720"),
        ({"pendingTimeoutHours": 721}, "more than 0 and at most 720"),
        ({"maxCostUSD": 0}, "'retry.maxCostUSD' must be more than 0"),
        ({"maxCostUSD": "5"}, "'retry.maxCostUSD' must be a number of US dollars or null"),
        ({"input": "gs://bucket/in.jsonl"}, "s3://BUCKET/KEY or file:///ABS/PATH"),
        ({"input": "s3://B/in.jsonl"}, "must be s3://BUCKET/KEY"),
        # a local file would be read from this host and uploaded: the CLI's, never an HTTP body's
        ({"input": "file:///etc/passwd"}, "a local file is given with opstate track"),
    ],
)
def test_an_invalid_policy_is_400_and_nothing_is_written(
    store: SQLiteStore, retry: object, message: str
) -> None:
    app = _app(store)
    status, body = _put(app, {"state": "RUNNING", "retry": retry})
    assert (status, body["error"]) == (400, "invalid-retry")
    assert message in body["message"]
    assert store.get(NAME) is None and store.get_retry(NAME) is None
    # nor on a record already tracked: its version and state stay, no retry state appears
    assert _put(app, {"state": "RUNNING"})[0] == 200
    before = store.get(NAME)
    status, body = _put(app, {"state": "SUCCEEDED", "retry": retry})
    assert status == 400 and store.get(NAME) == before and store.get_retry(NAME) is None


def test_a_valid_policy_is_kept_and_the_view_shows_it(store: SQLiteStore) -> None:
    app = _app(store)
    status, body = _put(
        app,
        {
            "state": "PENDING",
            "details": {"model": "models/gemini-2.5-flash"},
            "retry": {"resubmitExpired": True, "input": "s3://in-bucket/jobs/a.jsonl"},
        },
    )
    assert status == 200 and body["applied"] is True and body["version"] == 1
    policy = {"maxAttempts": 2, "resubmitExpired": True, "pendingTimeoutHours": None}
    # maxAttempts from the settings' default, the rest from the body
    assert body["retry"] == {
        "policy": policy,
        "status": "active",
        "reason": None,
        "children": [],
        "input": None,  # not yet copied: the runner keeps it
    }
    state = store.get_retry(NAME)
    assert state is not None
    assert (state.status, state.rev, state.due_ns) == (RETRY_ACTIVE, 1, NOW)
    assert state.created_ns == store.get(NAME).created_ns  # type: ignore[union-attr]
    assert state.doc["policy"] == policy
    assert state.doc["model"] is None  # a report's details.model is never kept (issue 38)
    assert state.doc["via"] == "api"  # attached over HTTP, by a caller with the right
    assert state.doc["input"]["source"] == "s3://in-bucket/jobs/a.jsonl"
    assert [(r.name, s.due_ns) for r, s in store.iter_retry_due(NOW)] == [(NAME, NOW)]
    status, view = _get(app)
    assert status == 200
    assert (view["parent"], view["root"], view["attempt"]) == (None, NAME, 0)
    assert view["retry"] == body["retry"]
    # a later report without "retry" leaves the policy as it was
    assert _put(app, {"state": "RUNNING"})[0] == 200
    assert store.get_retry(NAME) == state
    # a policy again: written over the same state (rev 2), the children kept
    status, again = _put(app, {"retry": {"maxAttempts": 0, "resubmitExpired": False}})
    assert status == 200 and again["retry"]["status"] == "off"
    after = store.get_retry(NAME)
    assert after is not None and (after.status, after.rev) == (RETRY_DONE, 2)


def test_a_policy_that_asks_nothing_writes_no_state(store: SQLiteStore) -> None:
    app = _app(store, Settings(**GRANTED))
    status, body = _put(app, {"retry": {"maxAttempts": 0}})
    assert status == 200 and body["retry"] is None
    assert store.get(NAME) is not None and store.get_retry(NAME) is None
    assert "retry" not in _get(app)[1]


def test_an_empty_retry_object_is_the_opt_in_with_two_retries(store: SQLiteStore) -> None:
    status, body = _put(_app(store, Settings(**GRANTED)), {"retry": {}})
    assert status == 200 and body["retry"]["policy"]["maxAttempts"] == 2
    state = store.get_retry(NAME)
    assert state is not None and state.doc["policy"]["maxAttempts"] == 2


def test_the_default_alone_attaches_no_policy(store: SQLiteStore) -> None:
    app = _app(store, Settings(retry_max_attempts=3, retry_resubmit_expired=True, **GRANTED))
    assert _put(app, None)[0] == 200  # "track this job"
    assert _put(app, {"state": "RUNNING"})[0] == 200
    assert store.get_retry(NAME) is None
    view = _get(app)[1]
    assert not {"parent", "root", "attempt", "retry"} & set(view)


def test_a_retry_child_takes_its_roots_policy(store: SQLiteStore) -> None:
    app = _app(store)
    child = "batches/child-1"
    assert _put(app, {"state": "RUNNING"}, child)[0] == 200
    record = store.get(child)
    assert record is not None
    lineage = {"root": NAME, "parent": NAME, "attempt": 1, "id": "opstate-0123456789ab-a1-0"}
    member = RetryState(RETRY_MEMBER, created_ns=record.created_ns, doc={"lineage": lineage})
    assert store.set_retry(child, 0, member)
    status, body = _put(app, {"state": "SUCCEEDED", "retry": {"maxAttempts": 1}}, child)
    assert (status, body["error"]) == (400, "invalid-retry")
    assert "takes its root's policy" in body["message"]
    assert store.get(child) == record  # the report was not written either
    status, view = _get(app, child)
    assert status == 200
    assert (view["parent"], view["root"], view["attempt"]) == (NAME, NAME, 1)
    assert view["retry"] is None


class FailingRetries(SQLiteStore):
    """A SQLite store whose retry slot is unavailable."""

    def set_retry(self, name: str, expected_rev: int, state: RetryState) -> bool:
        raise StoreUnavailableError("retry slot down")


def test_a_store_fault_while_keeping_the_policy_is_503(tmp_path: Path) -> None:
    store = FailingRetries(tmp_path / "ops.db")
    try:
        status, body = _put(_app(store), {"retry": {"maxAttempts": 1}})
        assert status == 503 and body["error"] == "unavailable"
    finally:
        store.close()


def test_a_record_of_the_previous_release_views_unchanged(store: SQLiteStore) -> None:
    app = _app(store)
    assert _put(app, {"state": "SUCCEEDED", "updateTime": "2026-01-02T03:04:05Z"})[0] == 200
    record = store.get(NAME)
    assert record is not None
    archive = ArchiveState(
        "archived", created_ns=record.created_ns, archived_ns=NOW, location="s3://r/summary.json"
    )
    assert store.set_archive(NAME, 0, archive)
    status, view = _get(app)
    assert status == 200
    results = {"status": "archived", "expiresAt": None, "location": "s3://r/summary.json"}
    assert view == json.loads(json.dumps(record_to_json(record, results)))
    assert list(view) == [
        "name",
        "kind",
        "backend",
        "state",
        "updateTime",
        "version",
        "source",
        "details",
        "createdAt",
        "appliedAt",
        "results",
    ]


def test_the_view_of_a_root_with_children(store: SQLiteStore) -> None:
    app = _app(store)
    assert _put(app, {"retry": {"maxAttempts": 2}})[0] == 200
    state = store.get_retry(NAME)
    assert state is not None
    children = [
        {"id": "opstate-x-a1-0", "attempt": 1, "parent": NAME, "name": "batches/c1", "rows": 3,
         "input": "s3://r/retry/opstate-x-a1-0.jsonl", "whole": False, "phase": "created",
         "claims": 1, "claimUntilNs": 0, "error": None},
        {"id": "opstate-x-a2-0", "attempt": 2, "parent": "batches/c1", "name": None, "rows": 1,
         "input": "s3://r/retry/opstate-x-a2-0.jsonl", "whole": False, "phase": "planned",
         "claims": 0, "claimUntilNs": 0, "error": None},
    ]  # fmt: skip
    doc = dict(state.doc) | {"children": children, "unavailable": None}
    assert store.set_retry(NAME, state.rev, RetryState(RETRY_ACTIVE, state.created_ns, 0, NOW, doc))
    view = _get(app)[1]
    assert view["retry"] == retry_view(doc)
    assert view["retry"]["children"] == [
        {"name": "batches/c1", "attempt": 1, "rows": 3, "phase": "created"},
        {"name": None, "attempt": 2, "rows": 1, "phase": "planned"},
    ]
