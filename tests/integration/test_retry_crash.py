"""Fault injection: a crash anywhere yields at most one child per planned retry (issue 33 §3).

Gemini's ``batches.create`` has no idempotency key. The engine writes the plan first and, after a
crash, looks for a child carrying the planned id before it creates one. These tests kill a real
``opstate retry --once`` process (SIGKILL, from the fake server's create hook: the batch exists
at Gemini, the process never hears of it), and stop an in-process pass at each other step
between the claim and the root's final write, then run the pass again: exactly one child, the
plan names it, and its record carries its lineage. ``opstate submit`` survives the same kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from opstate.config import settings
from opstate.retry import children as children_module
from opstate.store.sqlite import SQLiteStore
from tests.integration.test_retry_scenario import settle
from tests.support.cli import in_process
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import answered, failed, write_input
from tests.support.serve_process import OPSTATE, cli_env

MODEL = "gemini-2.5-flash"


@pytest.fixture
def env(tmp_path: Path, fake_gemini: FakeGemini) -> dict[str, str]:
    return {
        "GEMINI_API_KEY": "test-key",
        "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url,
        "OPSTATE_RECONCILE_MAX_PAGES": "0",
        "OPSTATE_STORE": f"sqlite:///{tmp_path / 'ops.db'}",
        "OPSTATE_RESULTS_URL": (tmp_path / "results").as_uri(),
    }


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys, env):
    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield in_process(monkeypatch, capsys)
    settings.cache_clear()


def ok(result: Any) -> Any:
    assert result.code == 0, result.err
    return result


def a_root_with_failures(cli, fake_gemini: FakeGemini, tmp_path: Path) -> tuple[str, list[str]]:
    keys = [f"k{i}" for i in range(6)]
    source = write_input(tmp_path / "in.jsonl", keys)
    root = ok(cli("submit", str(source), "--model", MODEL, "--retry-attempts", "2", "--json"))
    name = root.json()["name"]
    fake_gemini.run_batch(
        name, [failed(k, 503, "UNAVAILABLE") for k in keys[:3]] + [answered(k) for k in keys[3:]]
    )
    settle(cli, name)
    return name, keys


def killed_while_creating(
    args: list[str], tmp_path: Path, env: dict[str, str], fake_gemini: FakeGemini
) -> None:
    """Run ``opstate ARGS`` in a process that the fake kills once its create is recorded."""
    process = subprocess.Popen(
        [*OPSTATE, *args],
        cwd=tmp_path,
        env=cli_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def kill(_: str) -> None:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    fake_gemini.on_create(kill)
    try:
        process.communicate(timeout=60)
    finally:
        fake_gemini.on_create(None)
    assert process.returncode == -signal.SIGKILL


def plan_of(tmp_path: Path, root: str) -> list[dict[str, Any]]:
    store = SQLiteStore(str(tmp_path / "ops.db"))
    try:
        state = store.get_retry(root)
        assert state is not None
        return list(state.doc["children"])
    finally:
        store.close()


def test_a_retry_killed_between_create_and_the_store_write_makes_one_child(
    cli, fake_gemini: FakeGemini, tmp_path: Path, env: dict[str, str]
) -> None:
    root, _ = a_root_with_failures(cli, fake_gemini, tmp_path)
    killed_while_creating(["retry", "--once"], tmp_path, env, fake_gemini)
    created = fake_gemini.batches_created()
    assert len(created) == 2  # Gemini holds the child; the store never heard of it
    (entry,) = plan_of(tmp_path, root)
    assert entry["phase"] == "creating" and entry["name"] is None

    # The claim is still held: a pass right after leaves it alone, one after its lease finds
    # the child by its id instead of creating another.
    assert ok(cli("retry", "--once")).json()["submitted"] == 0
    result = ok(cli("retry", "--once", env={"OPSTATE_RETRY_LEASE_SECONDS": "1"}))
    assert result.json()["submitted"] == 0  # the lease given at the claim still holds
    store = SQLiteStore(str(tmp_path / "ops.db"))
    try:
        state = store.get_retry(root)
        assert state is not None
        doc = json.loads(json.dumps(state.doc))
        doc["children"][0]["claimUntilNs"] = 1  # the lease ran out
        from dataclasses import replace

        assert store.set_retry(root, state.rev, replace(state, doc=doc))
    finally:
        store.close()
    assert ok(cli("retry", "--once")).json()["submitted"] == 1
    assert fake_gemini.batches_created() == created
    (entry,) = plan_of(tmp_path, root)
    assert (entry["phase"], entry["name"]) == ("created", created[1])
    got = ok(cli("get", created[1], "--json")).json()
    assert (got["root"], got["parent"], got["attempt"]) == (root, root, 1)


@pytest.mark.parametrize("step", ["upload", "create", "track", "ingest"])
def test_a_pass_stopped_at_any_step_then_run_again_makes_one_child(
    cli, fake_gemini: FakeGemini, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    root, keys = a_root_with_failures(cli, fake_gemini, tmp_path)

    class Crash(BaseException):
        """Not an Exception: nothing in the pass catches it, as nothing survives a kill."""

    targets = {
        "upload": (children_module, "upload_jsonl"),
        "create": (children_module, "create_or_delete"),
        "ingest": (children_module, "ingest"),
        "track": (children_module.Creator, "_track"),
    }
    owner, attribute = targets[step]
    real = getattr(owner, attribute)

    def crash_after(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise Crash(step)

    monkeypatch.setattr(owner, attribute, crash_after)
    with pytest.raises(Crash):
        cli("retry", "--once")
    monkeypatch.setattr(owner, attribute, real)
    monkeypatch.setenv("OPSTATE_RETRY_LEASE_SECONDS", "1")
    # The claim lasts 1 s from now on; the crashed one holds until its own lease: expire it.
    store = SQLiteStore(str(tmp_path / "ops.db"))
    try:
        state = store.get_retry(root)
        assert state is not None
        doc = json.loads(json.dumps(state.doc))
        for entry in doc["children"]:
            entry["claimUntilNs"] = 1
        from dataclasses import replace

        assert store.set_retry(root, state.rev, replace(state, doc=doc))
    finally:
        store.close()
    ok(cli("retry", "--once"))
    ok(cli("retry", "--once"))
    created = fake_gemini.batches_created()
    assert len(created) == 2, f"{step}: {created}"
    (entry,) = plan_of(tmp_path, root)
    assert (entry["phase"], entry["name"]) == ("created", created[1])
    child_keys = [
        json.loads(line)["key"] for line in fake_gemini.batch_input(created[1]).splitlines()
    ]
    assert child_keys == keys[:3]


def test_a_submit_killed_after_create_tracks_the_batch_it_created_when_run_again(
    cli, fake_gemini: FakeGemini, tmp_path: Path, env: dict[str, str]
) -> None:
    source = write_input(tmp_path / "in.jsonl", ["a", "b"])
    args = ["submit", str(source), "--model", MODEL, "--retry-attempts", "1", "--json"]
    killed_while_creating(args, tmp_path, env, fake_gemini)
    (created,) = fake_gemini.batches_created()
    again = ok(cli(*args)).json()
    assert again["name"] == created and again["created"] is False
    assert fake_gemini.batches_created() == [created]
    got = ok(cli("get", created, "--json")).json()
    assert got["retry"]["policy"]["maxAttempts"] == 1
