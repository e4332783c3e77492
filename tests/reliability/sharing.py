"""Many processes on one SQLite file (issue 30): load over HTTP, ``opstate`` commands in a loop,
a plain ``sqlite3`` reader and writer, and the final count of every acknowledged write.

Every acknowledgement is kept (``Acks``): an HTTP 200 (the record's name, version and state it
answered, and the delivery's (rank, time)), a quarantined delivery's webhook-id, an ``opstate``
command's JSON answer. ``file_checks`` compares them with the file once every process has
stopped: a record behind what was acknowledged (a lower version, a lower rank, an earlier time
of a state that was answered) or missing is a lost write.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.client import HTTPException
from pathlib import Path
from typing import Any
from urllib.parse import quote

from opstate.domain.states import RANK, parse_state
from opstate.domain.times import parse_time
from tests.reliability.support import Delivery, delivery_request, live_headers
from tests.support.serve_process import cli_env, http, run_cli

# What no process may ever see from another's normal work (issue 30): SQLite's own sentences.
FORBIDDEN = ("disk image is malformed", "disk i/o error", "not a database", "database corrupt")


@dataclass(frozen=True)
class Ack:
    """One acknowledged write: the record is at least at ``version`` and ``state``, and at or
    past ``key`` (the (rank, ns) of the delivery written), as the answer said."""

    name: str
    version: int
    state: str
    key: tuple[int, int] | None
    via: str


@dataclass
class Acks:
    """Every acknowledgement and every error seen, from any thread."""

    records: list[Ack] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)  # webhook-ids answered "quarantined"
    errors: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    commands: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ack: Ack) -> None:
        with self.lock:
            self.records.append(ack)

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text if len(text) <= 900 else f"{text[:300]} ... {text[-600:]}")

    def status(self, status: int) -> None:
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1

    def ran(self, command: str) -> None:
        with self.lock:
            self.commands[command] = self.commands.get(command, 0) + 1


def answer_ack(answer: Any, key: tuple[int, int] | None, via: str) -> Ack | None:
    """The acknowledgement in a 200 answer (API or ``--json``) naming a record; else None."""
    if not isinstance(answer, dict) or not answer.get("name") or not answer.get("state"):
        return None
    return Ack(str(answer["name"]), int(answer["version"]), str(answer["state"]), key, via)


# -- HTTP load ----------------------------------------------------------------------------------


def http_send(
    url: str, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, Any]:
    """One request (``serve_process.http``); status 0 when the server could not be reached
    (killed, restarting)."""
    try:
        status, _, answer = http(method, url + path, body, headers, timeout=30)
    except (OSError, HTTPException):  # refused, reset, cut mid-answer
        return 0, None
    return status, answer


def _request_of(d: Delivery) -> tuple[str, str, bytes, dict[str, str]]:
    method, path, body, headers = delivery_request(d)
    if method == "PUT":
        path = "/operations/" + quote(d.name, safe="/")
    return method, path, body.encode(), headers


def deliver(url: Callable[[], str], d: Delivery, acks: Acks, stop: threading.Event) -> None:
    """Send ``d`` until it is answered (a 503 or an unreachable server is tried again) or the
    run stops; a 200 is an acknowledgement, anything else an error."""
    method, path, body, headers = _request_of(d)
    for attempt in itertools.count():
        status, answer = http_send(url(), method, path, body, headers)
        acks.status(status)
        if status == 200:
            ack = answer_ack(answer, d.key, "http")
            if ack is None:
                acks.error(f"200 without a record for {d.name}: {answer!r}")
            else:
                acks.add(ack)
            return
        if status not in (0, 503):
            acks.error(f"HTTP {status} for {method} {d.name}: {answer!r}")
            return
        if stop.is_set():
            return
        time.sleep(min(0.2, 0.005 * (attempt + 1)))


def quarantine_once(url: str, acks: Acks, n: int) -> None:
    """A signed delivery that cannot be read: kept in the quarantine table and answered 200."""
    body = b"{not json " + str(n).encode()
    headers = live_headers(body)
    status, answer = http_send(url, "POST", "/gemini/webhook", body, headers)
    acks.status(status)
    if status == 200 and isinstance(answer, dict) and answer.get("reason") == "quarantined":
        with acks.lock:
            acks.quarantined.append(headers["webhook-id"])
    elif status not in (0, 503):
        acks.error(f"HTTP {status} for a quarantined delivery: {answer!r}")


def sender(
    urls: Sequence[Callable[[], str]], lane: Sequence[Delivery], acks: Acks, stop: threading.Event
) -> None:
    """Deliver ``lane`` in order, each to one of ``urls`` in turn; every 50th delivery is
    followed by one the quarantine keeps."""
    for i, d in enumerate(lane):
        if stop.is_set():
            return
        url = urls[i % len(urls)]
        deliver(url, d, acks, stop)
        if i % 50 == 49:
            quarantine_once(url(), acks, i)


def start_senders(
    urls: Sequence[Callable[[], str]],
    deliveries: Sequence[Delivery],
    acks: Acks,
    stop: threading.Event,
    threads: int = 4,
) -> list[threading.Thread]:
    lanes = [deliveries[i::threads] for i in range(threads)]
    workers = [
        threading.Thread(target=sender, args=(urls, lane, acks, stop), daemon=True)
        for lane in lanes
    ]
    for w in workers:
        w.start()
    return workers


# -- opstate commands in a loop -----------------------------------------------------------------

Command = tuple[str, list[str]]  # (what it is, argv without --store)


def writer_commands(prefix: str, replay_dir: Path) -> Iterator[Command]:
    """Commands that write (track, report, replay of a file) and read back what they wrote
    (get, wait on what they finished), forever."""
    for n in itertools.count():
        name = f"batches/{prefix}-{n:04d}"
        yield "track", ["track", name, "--json"]
        yield "report", ["report", name, "RUNNING", "--json"]
        yield "report", ["report", name, "SUCCEEDED", "--json"]
        yield "wait", ["wait", name, "--timeout", "5", "--json"]
        yield "get", ["get", name, "--json"]
        yield "replay", ["replay", str(replay_file(replay_dir, f"{prefix}-r{n:04d}")), "--json"]


def reader_commands(names: Sequence[str]) -> Iterator[Command]:
    """Commands that read (get of names that may not exist yet, list, quarantine list) and
    the replay of the quarantine (which keeps what it still cannot read), forever."""
    for n in itertools.count():
        yield "get-any", ["get", names[n % len(names)], "--json"]
        yield "list", ["list", "--open", "--json"]
        yield "quarantine list", ["quarantine", "list", "--json"]
        yield "replay-quarantine", ["replay", "--quarantine", "--limit", "5", "--json"]


REPLAY_LINES = 3


def replay_file(folder: Path, stem: str) -> Path:
    """A JSONL file of ``REPLAY_LINES`` reports, each a new operation RUNNING now."""
    path = folder / f"{stem}.jsonl"
    now = time.time_ns()
    lines = [
        {
            "name": f"batches/{stem}-{i}",
            "state": "RUNNING",
            "updateTime": f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(now // 10**9))}Z",
        }
        for i in range(REPLAY_LINES)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _forbidden(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in FORBIDDEN) or "Traceback" in text


# Exit 1 that is the command's answer, not a failure: (kind, what it then says on stderr).
ANSWERS_WITH_EXIT_1 = {
    "get-any": ("no record for",),
    "results": ("no record for", "no archive status yet"),
}


def _answered(kind: str, result: subprocess.CompletedProcess[str]) -> bool:
    """Whether the command did its work (exit 0, or exit 1 that is an answer)."""
    if result.returncode == 0:
        return True
    if result.returncode != 1:
        return False
    if kind == "replay-quarantine":  # exit 1: some deliveries are still unreadable, and kept
        answer = json.loads(result.stdout)
        return bool(answer.get("unreadable")) and not answer.get("errors")
    return any(text in result.stderr for text in ANSWERS_WITH_EXIT_1.get(kind, ()))


def judge(kind: str, argv: list[str], result: subprocess.CompletedProcess[str], acks: Acks) -> None:
    """Record what one command acknowledged, or why it failed."""
    acks.ran(kind)
    said = f"opstate {' '.join(argv)} -> exit {result.returncode}: {result.stderr.strip()[-600:]}"
    if _forbidden(result.stdout + result.stderr) or not _answered(kind, result):
        acks.error(said + " " + result.stdout[:300])
        return
    if kind in ("track", "report"):
        ack = answer_ack(json.loads(result.stdout), None, f"cli {kind}")
        if ack is None:
            acks.error(said + " " + result.stdout[:300])
        else:
            acks.add(ack)
    elif kind == "replay":
        _judge_replay(argv, json.loads(result.stdout), acks, said)


def _judge_replay(argv: list[str], answer: dict[str, Any], acks: Acks, said: str) -> None:
    if answer.get("applied") != REPLAY_LINES:
        acks.error(f"{said}: {answer}")
        return
    for line in Path(argv[1]).read_text().splitlines():
        report = json.loads(line)
        state = parse_state(report["state"])
        key = (RANK[state], parse_time(report["updateTime"]))
        acks.add(Ack(report["name"], 1, str(state), key, "cli replay"))


def command_loop(
    commands: Iterator[Command],
    store_url: str,
    cwd: Path,
    acks: Acks,
    stop: threading.Event,
    env: dict[str, str | None] | None = None,
) -> None:
    """Run ``commands`` one after another (each a new ``opstate`` process) until ``stop``."""
    for kind, argv in commands:
        if stop.is_set():
            return
        try:
            result = run_cli([*argv, "--store", store_url], cwd=cwd, env=env, timeout=60)
        except subprocess.TimeoutExpired:
            acks.error(f"opstate {' '.join(argv)} did not finish in 60 s")
            continue
        judge(kind, argv, result, acks)


def start_loops(
    count: int,
    store_url: str,
    cwd: Path,
    acks: Acks,
    stop: threading.Event,
    commands: Callable[[int], Iterator[Command]],
    env: dict[str, str | None] | None = None,
) -> list[threading.Thread]:
    loops = [
        threading.Thread(
            target=command_loop,
            args=(commands(i), store_url, cwd, acks, stop, env),
            daemon=True,
        )
        for i in range(count)
    ]
    for loop in loops:
        loop.start()
    return loops


# -- a plain sqlite3 process beside them --------------------------------------------------------

_PLAIN_SQLITE = textwrap.dedent(
    """
    import sqlite3, sys, time
    path, stop = sys.argv[1], sys.argv[2]
    n = 0
    while True:
        n += 1
        conn = sqlite3.connect(path, timeout=10)
        try:
            conn.execute("SELECT COUNT(*), MAX(version) FROM operations").fetchone()
            conn.execute("SELECT name, state FROM operations ORDER BY name LIMIT 50").fetchall()
            if n % 5 == 0:
                conn.execute("CREATE TABLE IF NOT EXISTS side (n INTEGER)")
                conn.execute("INSERT INTO side VALUES (?)", (n,))
                conn.commit()
        except sqlite3.Error as exc:
            print("error:", exc, flush=True)
        finally:
            conn.close()
        print("round", n, flush=True)
        if __import__("os").path.exists(stop):
            break
        time.sleep(0.02)
    """
)


@dataclass
class PlainSqlite:
    """A ``python -c`` process using only ``sqlite3``: reads the operations, writes a table
    of its own, connects and closes again and again (as an operator's ``sqlite3`` would)."""

    process: subprocess.Popen[str]
    stop_file: Path

    def finish(self) -> tuple[int, list[str]]:
        """Stop it; (rounds done, error lines)."""
        self.stop_file.touch()
        out, _ = self.process.communicate(timeout=30)
        lines = out.splitlines()
        return sum(1 for x in lines if x.startswith("round")), [
            x for x in lines if not x.startswith("round")
        ]


def start_plain_sqlite(db: Path, folder: Path) -> PlainSqlite:
    stop_file = folder / "plain-sqlite.stop"
    process = subprocess.Popen(
        [sys.executable, "-c", _PLAIN_SQLITE, str(db), str(stop_file)],
        cwd=folder,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return PlainSqlite(process, stop_file)


def summary(acks: Acks) -> str:
    return (
        f"{len(acks.records)} record acks, {len(acks.quarantined)} quarantined, "
        f"statuses {acks.statuses}, commands {acks.commands}, errors {len(acks.errors)}"
    )


def wait_for_load(acks: Acks, kinds: set[str], records: int, timeout: float) -> None:
    """Wait until every kind of command in ``kinds`` ran at least once and more than
    ``records`` writes were acknowledged (or ``timeout``): the load is measured in work done,
    not in seconds, so a slow or busy machine runs it longer instead of failing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with acks.lock:
            if kinds <= set(acks.commands) and len(acks.records) > records:
                return
        time.sleep(0.1)


def stop_all(stop: threading.Event, threads: Sequence[threading.Thread], timeout: float) -> None:
    stop.set()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(timeout=max(0.1, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running: {alive}"
