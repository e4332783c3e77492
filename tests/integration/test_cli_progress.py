"""Progress on long work (issue 49): ``submit`` (reading, checking, keeping, uploading the
input) and ``wait`` (the counts the record's details show) draw tqdm bars on stderr when it is
a terminal, here a real one (``pty``), and write nothing of them when stderr is a pipe or with
``--no-progress``. The commands' answers on stdout are the same either way."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest

from tests.support.fake_gemini import FakeGemini
from tests.support.serve_process import OPSTATE, cli_env

MODEL = "gemini-2.5-flash"
ROWS = 2000


def _input(path: Path) -> Path:
    request = {"contents": [{"parts": [{"text": "x" * 200}]}]}
    lines = [json.dumps({"key": f"k{i}", "request": request}) for i in range(ROWS)]
    path.write_text("\n".join(lines) + "\n")
    return path


def on_terminal(
    args: list[str], *, cwd: Path, env: dict[str, str | None], tty: bool
) -> tuple[int, str, str]:
    """``opstate ARGS`` with stderr on a pseudo-terminal (``tty``) or a pipe: exit code,
    stdout, what stderr received."""
    full_env = cli_env({"COLUMNS": "100", "TERM": "xterm", **env})
    if not tty:
        done = subprocess.run(
            [*OPSTATE, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=60
        )
        return done.returncode, done.stdout, done.stderr
    primary, secondary = pty.openpty()
    # a terminal's size, as a terminal window has one
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    process = subprocess.Popen(
        [*OPSTATE, *args],
        cwd=cwd,
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=secondary,
    )
    os.close(secondary)
    drawn = bytearray()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # the child closed its end
                    break
                if not chunk:
                    break
                drawn.extend(chunk)
            elif process.poll() is not None:
                break
        out = process.communicate(timeout=30)[0].decode()
    finally:
        os.close(primary)
        if process.poll() is None:
            process.kill()
            process.wait()
    # the terminal's own "\r\n" for each "\n" undone: a "\r" left is one the command drew
    return process.returncode, out, drawn.decode(errors="replace").replace("\r\n", "\n")


@pytest.fixture
def env(fake_gemini: FakeGemini, tmp_path: Path) -> dict[str, str | None]:
    return {
        "GEMINI_API_KEY": "test-key",
        "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url,
        "OPSTATE_STORE": f"sqlite:///{tmp_path / 'ops.db'}",
        "OPSTATE_RESULTS_URL": (tmp_path / "results").as_uri(),
    }


def test_submit_draws_each_stage_on_a_terminal(tmp_path: Path, env: dict[str, str | None]) -> None:
    source = _input(tmp_path / "big.jsonl")
    code, out, drawn = on_terminal(
        ["submit", str(source), "--model", MODEL], cwd=tmp_path, env=env, tty=True
    )
    assert code == 0, drawn
    assert "submitted, 2000 requests" in out
    for stage in ("reading", "checking", "keeping", "uploading"):
        assert f"{stage}:" in drawn, drawn
    assert "100%|" in drawn and "\r" in drawn and "B/s" in drawn  # bytes, redrawn in place


@pytest.mark.parametrize("flag", [[], ["--no-progress"]], ids=["pipe", "no-progress"])
def test_submit_is_silent_without_a_terminal_or_with_no_progress(
    tmp_path: Path, env: dict[str, str | None], flag: list[str]
) -> None:
    source = _input(tmp_path / "big.jsonl")
    code, out, err = on_terminal(
        ["submit", str(source), "--model", MODEL, *flag], cwd=tmp_path, env=env, tty=bool(flag)
    )
    assert code == 0, err
    assert "submitted, 2000 requests" in out
    assert err == "" and "\r" not in err


def _running(tmp_path: Path, env: dict[str, str | None]) -> None:
    stats = {
        "batch_stats": {
            "requestCount": 5,
            "successfulRequestCount": 2,
            "failedRequestCount": 1,
            "pendingRequestCount": 2,
        }
    }
    args = ["report", "batches/w", "RUNNING", "--details", json.dumps(stats)]
    code, _, err = on_terminal(args, cwd=tmp_path, env=env, tty=False)
    assert code == 0, err


def test_wait_draws_the_counts_the_details_show(tmp_path: Path, env: dict[str, str | None]) -> None:
    _running(tmp_path, env)
    code, out, drawn = on_terminal(
        ["wait", "batches/w", "--timeout", "1.5"], cwd=tmp_path, env=env, tty=True
    )
    assert code == 124, drawn
    assert out == ""
    assert "batches/w RUNNING" in drawn and "3/5 rows" in drawn.replace("  ", " ")
    assert "successful 2" in drawn and "failed 1" in drawn and "pending 2" in drawn
    assert "timed out after 1.5 s" in drawn


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "no-progress"])
def test_wait_is_silent_without_a_terminal_or_with_no_progress(
    tmp_path: Path, env: dict[str, str | None], tty: bool
) -> None:
    _running(tmp_path, env)
    args = ["wait", "batches/w", "--timeout", "0.5", *(["--no-progress"] if tty else [])]
    code, _, err = on_terminal(args, cwd=tmp_path, env=env, tty=tty)
    assert code == 124
    assert "\r" not in err and "rows" not in err
    assert err.strip().splitlines() == [
        "opstate: timed out after 0.5 s waiting for batches/w (terminal)"
    ]
