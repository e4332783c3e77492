"""``opstate track NAME`` with retry flags, ``opstate get`` and ``opstate results --json`` of a
retry root over the SQLite store (issue 33; docs/retry.md): bad flags write nothing, good ones
keep the policy beside the record, plain tracking keeps none whatever the default says, and a
record without a retry state shows exactly as before."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.cli.common import EXIT_OK, EXIT_USAGE
from opstate.config import settings
from opstate.domain.costs import REASON_FINAL_PREVIOUS_RELEASE
from opstate.store.port import ArchiveState
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RETRY_MEMBER, RetryState
from opstate.store.sqlite import SQLiteStore
from tests.support.cli import Result, in_process

NAME = "batches/root-9"
NOW = 1_780_000_000_000_000_000


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ops.db"


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    db: Path,
) -> Iterator[Callable[..., Result]]:
    monkeypatch.chdir(tmp_path)
    for key in (
        "OPSTATE_TABLE_NAME",
        "OPSTATE_RETRY_MAX_ATTEMPTS",
        "OPSTATE_RETRY_RESUBMIT_EXPIRED",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OPSTATE_STORE", f"sqlite:///{db}")
    yield in_process(monkeypatch, capsys)
    settings.cache_clear()


def _open(db: Path) -> SQLiteStore:
    return SQLiteStore(db)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--retry-attempts", "11"], "between 0 and 10"),
        (["--retry-attempts", "-1"], "between 0 and 10"),
        (["--pending-timeout-hours", "0"], "more than 0 and at most 720"),
        (["--pending-timeout-hours", "1000"], "more than 0 and at most 720"),
        (["--pending-timeout-hours", "nan"], "more than 0 and at most 720"),
        (["--input", "s3://UPPER/in.jsonl"], "must be s3://BUCKET/KEY"),
        (["--input", "gs://bucket/in.jsonl"], "s3://BUCKET/KEY or file:///ABS/PATH"),
        (["--input", "missing.jsonl"], "no such file"),
        (["--input", "file:///data/../in.jsonl"], "no '..'"),
        (["--max-cost-usd", "0"], "'retry.maxCostUSD' must be more than 0"),
        (["--max-cost-usd", "inf"], "'retry.maxCostUSD' must be more than 0"),
    ],
)
def test_bad_flags_write_nothing(
    cli: Callable[..., Result], db: Path, flags: list[str], message: str
) -> None:
    result = cli("track", NAME, *flags)
    assert result.code == EXIT_USAGE, (result.out, result.err)
    assert message in result.err and "Traceback" not in result.err
    store = _open(db)
    try:
        assert store.get(NAME) is None and store.get_retry(NAME) is None
    finally:
        store.close()


def test_track_with_flags_keeps_the_policy_and_get_shows_it(
    cli: Callable[..., Result], db: Path, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"key": "a", "request": {}}\n')
    result = cli(
        "track",
        NAME,
        "--resubmit-expired",
        "--pending-timeout-hours",
        "36",
        "--input",
        "in.jsonl",
        "--json",
        env={"OPSTATE_RETRY_MAX_ATTEMPTS": "3"},
    )
    assert result.code == EXIT_OK, result.err
    answer = result.json()
    policy = {"maxAttempts": 3, "resubmitExpired": True, "pendingTimeoutHours": 36.0}
    assert answer["applied"] is True and answer["state"] == "PENDING"
    assert answer["retry"]["policy"] == policy and answer["retry"]["status"] == "active"
    store = _open(db)
    try:
        state = store.get_retry(NAME)
        assert state is not None and (state.status, state.rev) == (RETRY_ACTIVE, 1)
        assert state.doc["input"]["source"] == source.resolve().as_uri()
    finally:
        store.close()
    view = cli("get", NAME, "--json").json()
    assert (view["parent"], view["root"], view["attempt"]) == (None, NAME, 0)
    assert view["retry"] == answer["retry"]
    shown = cli("get", NAME)
    lines = shown.out.splitlines()
    assert shown.code == EXIT_OK and "retry" in lines
    assert lines[lines.index("retry") + 1 :][:3] and ["status", "active"] in [
        line.split() for line in lines[lines.index("retry") + 1 :]
    ]
    # the text answer of track names the status and the policy
    text = cli("track", NAME, "--retry-attempts", "1")
    assert text.code == EXIT_OK and "retry: active" in text.out
    # a spending cap (issue 41) is kept with the policy and shown
    capped = cli("track", NAME, "--retry-attempts", "1", "--max-cost-usd", "2.5")
    assert capped.code == EXIT_OK and "maxCostUSD 2.5" in capped.out
    assert cli("get", NAME, "--json").json()["retry"]["policy"]["maxCostUSD"] == 2.5


def test_plain_track_attaches_no_policy_whatever_the_default(
    cli: Callable[..., Result], db: Path
) -> None:
    env = {"OPSTATE_RETRY_MAX_ATTEMPTS": "2", "OPSTATE_RETRY_RESUBMIT_EXPIRED": "true"}
    result = cli("track", NAME, "--json", env=env)
    assert result.code == EXIT_OK and "retry" not in result.json()
    view = cli("get", NAME, "--json").json()
    assert not {"parent", "root", "attempt", "retry"} & set(view)
    store = _open(db)
    try:
        assert store.get_retry(NAME) is None
    finally:
        store.close()


def test_a_retry_child_refuses_a_policy_of_its_own(cli: Callable[..., Result], db: Path) -> None:
    child = "batches/child-9"
    assert cli("track", child).code == EXIT_OK
    store = _open(db)
    try:
        record = store.get(child)
        assert record is not None
        lineage = {"root": NAME, "parent": NAME, "attempt": 1, "id": "opstate-abc-a1-0"}
        member = RetryState(RETRY_MEMBER, created_ns=record.created_ns, doc={"lineage": lineage})
        assert store.set_retry(child, 0, member)
    finally:
        store.close()
    result = cli("track", child, "--retry-attempts", "2")
    assert result.code == EXIT_USAGE and "takes its root's policy" in result.err
    view = cli("get", child, "--json").json()
    assert (view["parent"], view["root"], view["attempt"], view["retry"]) == (NAME, NAME, 1, None)


ROOT_DOC: dict[str, Any] = {
    "policy": {"maxAttempts": 2, "resubmitExpired": False, "pendingTimeoutHours": None},
    "model": "models/gemini-2.5-flash",
    "input": {"source": None, "location": "file:///r/inputs/ab/input.jsonl", "sha256": "ab",
              "rows": 6, "bytes": 300},
    "unavailable": None,
    "stopped": None,
    "children": [
        {"id": "opstate-h-a2-0", "attempt": 2, "parent": "batches/c1", "name": "batches/c2",
         "rows": 1, "input": "file:///r/retry/opstate-h-a2-0.jsonl", "whole": False,
         "phase": "created", "claims": 1, "claimUntilNs": 0, "error": None},
        {"id": "opstate-h-a1-0", "attempt": 1, "parent": NAME, "name": "batches/c1", "rows": 3,
         "input": "file:///r/retry/opstate-h-a1-0.jsonl", "whole": False, "phase": "created",
         "claims": 1, "claimUntilNs": 0, "error": None},
    ],
    "cancelled": [],
    "final": {"status": "final", "location": "file:///r/batches/root-9/final.jsonl",
              "rows": {"total": 6, "answered": 5, "blocked": 1, "failed": 1},
              "errors": {"400": 1}, "retried": 4, "attempts": 3},
}  # fmt: skip


def _archived(db: Path, name: str) -> int:
    store = _open(db)
    try:
        record = store.get(name)
        assert record is not None
        archive = ArchiveState(
            "archived",
            created_ns=record.created_ns,
            archived_ns=NOW,
            location="file:///r/batches/root-9/summary.json",
            summary={"rows": {"total": 6, "succeeded": 3, "failed": 3}, "errors": {"429": 2}},
        )
        assert store.set_archive(name, 0, archive)
        return record.created_ns
    finally:
        store.close()


def test_results_json_of_a_root_adds_lineage_and_final(
    cli: Callable[..., Result], db: Path
) -> None:
    assert cli("report", NAME, "SUCCEEDED").code == EXIT_OK
    created_ns = _archived(db, NAME)
    before = cli("results", NAME, "--json").json()
    assert "lineage" not in before and "final" not in before
    store = _open(db)
    try:
        assert store.set_retry(NAME, 0, RetryState(RETRY_DONE, created_ns, 0, 0, ROOT_DOC))
    finally:
        store.close()
    after = cli("results", NAME, "--json").json()
    assert after["lineage"] == [NAME, "batches/c1", "batches/c2"]
    assert after["final"] == {
        "status": "final",
        "location": "file:///r/batches/root-9/final.jsonl",
        "rows": {"total": 6, "answered": 5, "blocked": 1, "failed": 1},
        "errors": {"400": 1},
        "attempts": 3,
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
    # the rest of the document is the archive's, as before
    assert {k: v for k, v in after.items() if k not in ("lineage", "final")} == before
    view = cli("get", NAME, "--json").json()
    assert view["retry"]["status"] == "final"
    assert view["retry"]["input"] == "file:///r/inputs/ab/input.jsonl"
