"""Run ``opstate serve`` and the ``opstate`` CLI as subprocesses, and talk HTTP to the server."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# The bearer token of the operations routes in every `opstate serve` the tests start (through
# OPSTATE_API_TOKEN), and the one ``http`` sends unless told otherwise. Test-only.
TEST_API_TOKEN = "opstate-test-api-token-0123456789abcdef"
OPSTATE = [sys.executable, "-m", "opstate.cli"]
_LISTENING = re.compile(r"listening on (http://\S+)")


def cli_env(extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The test environment for a child: the layer importable, no real keys, no stray store."""
    env = dict(os.environ)
    for key in ("OPSTATE_STORE", "OPSTATE_TABLE_NAME", "OPSTATE_WEBHOOK_SECRETS", "GEMINI_API_KEY"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "layers" / "opstate"), str(ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    env["OPSTATE_API_TOKEN"] = TEST_API_TOKEN
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_cli(
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str | None] | None = None,
    stdin: str | None = None,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OPSTATE, *args],
        cwd=cwd,
        env=cli_env(env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class ServeProcess:
    process: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)
    signalled: bool = False
    _queue: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def output(self) -> str:
        self._drain()
        return "".join(self.lines)

    def _drain(self) -> None:
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                return
            if line is not None:
                self.lines.append(line)

    def wait_for_line(self, pattern: str, timeout: float = 10) -> str:
        regex = re.compile(pattern)
        for line in self.lines:
            if regex.search(line):
                return line
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                received = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if received is None:
                break
            self.lines.append(received)
            if regex.search(received):
                return received
        raise AssertionError(f"no line matching {pattern!r} in:\n{self.output()}")

    def send_signal(self, sig: int = signal.SIGTERM) -> None:
        self.signalled = True
        self.process.send_signal(sig)

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        """Signal once (unless already signalled) and wait for the exit code."""
        if self.process.poll() is None and not self.signalled:
            self.send_signal(sig)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            raise
        assert self.process.stdout is not None
        self._drain()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def start_serve(
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str | None] | None = None,
    timeout: float = 20,
) -> ServeProcess:
    """Start ``opstate serve --port 0 ARGS`` and wait for its ``listening on`` line."""
    process = subprocess.Popen(
        [*OPSTATE, "serve", "--port", "0", *args],
        cwd=cwd,
        env=cli_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        bufsize=1,
    )
    handle = ServeProcess(process, url="")

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            handle._queue.put(line)
        handle._queue.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        line = handle.wait_for_line(_LISTENING.pattern, timeout=timeout)
    except AssertionError:
        handle.kill()
        raise
    match = _LISTENING.search(line)
    assert match is not None
    handle.url = match.group(1)
    return handle


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10,
    token: str | None = TEST_API_TOKEN,
) -> tuple[int, dict[str, str], Any]:
    """One request (with ``Authorization: Bearer <token>`` unless ``token`` is None); returns
    (status, headers, parsed JSON or raw text)."""
    sent = dict(headers or {})
    if token is not None:
        sent.setdefault("Authorization", f"Bearer {token}")
    request = urllib.request.Request(url, data=body, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, got, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, got, raw = exc.code, dict(exc.headers), exc.read()
    try:
        parsed: Any = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode("utf-8", "replace")
    return status, got, parsed
