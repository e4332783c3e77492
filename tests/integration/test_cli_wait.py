"""``opstate wait``: returns as specified when another process changes the record, times out
with 124, refuses bad usage with 2, and reads the store only a few times a second."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from opstate.cli import main
from opstate.config import settings
from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.ingest import ingest
from opstate.store.port import PollState
from opstate.store.sqlite import SQLiteStore
from opstate.waiters import wiring
from opstate.waiters.model import PENDING, Failure, Status, Success, When
from opstate.waiters.run import WAIT_POLL_INTERVAL_S, store_status, wait_until
from tests.support.serve_process import OPSTATE, cli_env, run_cli

NAME = "batches/wait-cli"
T0 = parse_time("2026-05-10T09:00:00Z")


def _popen_wait(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*OPSTATE, "wait", NAME, "--store", "sqlite:///ops.db", *args],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _report(tmp_path: Path, state: str, when: str) -> None:
    done = run_cli(
        ["report", NAME, state, "--time", when, "--store", "sqlite:///ops.db"], cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("state", "code"), [("SUCCEEDED", 0), ("FAILED", 1), ("CANCELLED", 1)])
def test_wait_returns_when_another_process_ends_the_job(
    tmp_path: Path, state: str, code: int
) -> None:
    _report(tmp_path, "RUNNING", "2026-05-10T09:00:00Z")
    waiting = _popen_wait(tmp_path, "--json", "--timeout", "60")
    time.sleep(1.0)
    assert waiting.poll() is None  # still waiting: the job runs
    _report(tmp_path, state, "2026-05-10T10:00:00Z")
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == code, err
    view = json.loads(out)
    assert (view["name"], view["state"]) == (NAME, state)
    if code:
        assert f"ended {state}" in err


def test_wait_on_an_untracked_name_waits_for_it_to_be_tracked_and_end(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "ops.db").close()
    waiting = _popen_wait(tmp_path, "--timeout", "60")
    time.sleep(0.8)
    _report(tmp_path, "SUCCEEDED", "2026-05-10T10:00:00Z")
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, err
    assert "not tracked" in err and "SUCCEEDED" in out


def test_wait_times_out_with_124(tmp_path: Path) -> None:
    _report(tmp_path, "RUNNING", "2026-05-10T09:00:00Z")
    started = time.monotonic()
    done = run_cli(["wait", NAME, "--timeout", "0.5", "--store", "sqlite:///ops.db"], cwd=tmp_path)
    assert done.returncode == 124, done.stderr
    assert "timed out" in done.stderr and time.monotonic() - started >= 0.5


def test_a_lost_operation_ends_the_wait_with_1(tmp_path: Path) -> None:
    _report(tmp_path, "RUNNING", "2026-05-10T09:00:00Z")
    store = SQLiteStore(tmp_path / "ops.db")
    record = store.get(NAME)
    assert record is not None
    assert store.set_poll(NAME, record.version, PollState(lost_ns=T0))
    store.close()
    done = run_cli(["wait", NAME, "--timeout", "10", "--store", "sqlite:///ops.db"], cwd=tmp_path)
    assert done.returncode == 1 and "ended LOST" in done.stderr


def test_wait_until_archived_returns_when_another_process_settles_the_archive(
    tmp_path: Path,
) -> None:
    """With the outcomes work in the build, ``--until archived`` waits past the terminal state
    for the archive status another process writes (here ``none``: nothing to copy)."""
    from opstate.store.port import ArchiveState

    _report(tmp_path, "SUCCEEDED", "2026-05-10T10:00:00Z")
    early = run_cli(
        ["wait", NAME, "--until", "archived", "--timeout", "0.5", "--store", "sqlite:///ops.db"],
        cwd=tmp_path,
    )
    assert early.returncode == 124, early.stderr  # terminal, but not archived yet
    waiting = _popen_wait(tmp_path, "--until", "archived", "--json", "--timeout", "60")
    time.sleep(0.8)
    assert waiting.poll() is None
    store = SQLiteStore(tmp_path / "ops.db")
    record = store.get(NAME)
    assert record is not None
    assert store.set_archive(NAME, 0, ArchiveState("none", created_ns=record.created_ns))
    store.close()
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, err
    assert json.loads(out)["state"] == "SUCCEEDED"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--until", "soon"], "invalid choice"),
        (["--timeout", "-1"], "--timeout"),
        (["--timeout", "soon"], "invalid float"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], fragment: str) -> None:
    done = run_cli(["wait", NAME, *args, "--store", "sqlite:///ops.db"], cwd=tmp_path)
    assert done.returncode == 2 and fragment in done.stderr


# -- the loop: a few reads a second, and the archived condition through the results port -----


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.reads: list[float] = []

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


def test_wait_reads_the_store_at_most_four_times_a_second() -> None:
    clock = FakeClock()

    def read(name: str, with_results: bool) -> Status:
        clock.reads.append(clock.now)
        return Status(None)

    assert (
        wait_until(
            read, NAME, When.TERMINAL, timeout_s=10, clock=lambda: clock.now, sleep=clock.sleep
        )
        is None
    )
    gaps = [b - a for a, b in zip(clock.reads, clock.reads[1:], strict=False)]
    assert all(g >= WAIT_POLL_INTERVAL_S - 1e-9 for g in gaps)
    assert len(clock.reads) <= 10 / WAIT_POLL_INTERVAL_S + 2
    assert WAIT_POLL_INTERVAL_S >= 0.2  # "a few times a second", never a busy loop


def test_wait_until_archived_uses_the_results_port(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ops.db")
    ingest(store, OpEvent(NAME, State.SUCCEEDED, T0, "report", {}), clock_ns=lambda: T0)
    archive: dict[str, Any] = {"status": "pending"}
    clock = FakeClock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 1:
            archive.update(status="archived", location="file:///results/")

    read = store_status(store, lambda name: dict(archive))
    done = wait_until(read, NAME, When.ARCHIVED, timeout_s=5, clock=lambda: clock.now, sleep=sleep)
    assert done is not None and isinstance(done[0], Success)
    assert done[0].output["results"]["location"] == "file:///results/"
    archive["status"] = "expired"
    done = wait_until(read, NAME, When.ARCHIVED, timeout_s=5, clock=lambda: clock.now, sleep=sleep)
    assert done is not None and isinstance(done[0], Failure) and done[0].error == "RESULTS_EXPIRED"
    assert wait_until(read, NAME, When.TERMINAL, timeout_s=0)[0] != PENDING  # type: ignore[index]


def test_the_cli_waits_until_archived_when_archiving_is_plugged_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore(tmp_path / "ops.db")
    ingest(store, OpEvent(NAME, State.SUCCEEDED, T0, "report", {}), clock_ns=lambda: T0)
    archive: dict[str, Any] = {"status": "pending"}
    seen: list[Any] = []

    def results_json(store: Any, name: str) -> dict[str, Any]:
        seen.append((type(store).__name__, name))
        return dict(archive)

    monkeypatch.setattr(wiring, "RESULTS_JSON", results_json)
    timer = threading.Timer(0.6, lambda: archive.update(status="none"))
    timer.start()
    settings.cache_clear()
    try:
        code = main(
            [
                "wait",
                NAME,
                "--until",
                "archived",
                "--timeout",
                "20",
                "--json",
                "--store",
                "sqlite:///ops.db",
            ]
        )
    finally:
        settings.cache_clear()
        timer.cancel()
    assert code == 0
    assert json.loads(capsys.readouterr().out)["state"] == "SUCCEEDED"
    assert seen[0] == ("SQLiteStore", NAME)  # results_json(store, name), the outcomes signature
    archive["status"] = "expired"
    settings.cache_clear()
    code = main(["wait", NAME, "--until", "archived", "--store", "sqlite:///ops.db"])
    printed = capsys.readouterr()
    assert code == 1 and "ended RESULTS_EXPIRED" in printed.err
    lines = printed.out.splitlines()  # the text form shows the results, as a block
    assert lines[lines.index("results") + 1].split() == ["status", "expired"]
