"""Issue 33's retry surface on one shared SQLite file, beside everything else that writes it.

``opstate serve --reconcile-every 0.3`` (its reconcile, archive and retry passes, and its API),
loops of ``opstate retry --once``, ``opstate submit`` of several inputs, ``opstate track NAME
--retry-attempts N --input FILE`` of batches created elsewhere, ``PUT /operations`` with a
``"retry"`` object of batches created with keyed inlined requests, and ``opstate get`` /
``results --json`` readers, all on one file, with the real google-genai client against the fake
Gemini. The fake's side (``GeminiSide``) runs every batch it holds: RUNNING, then SUCCEEDED with
an output whose rows fail 503 (or 400) by a rule of the key and the attempt, so the final result
of every request is known before the run (``expected``).

Hostile ``"retry"`` bodies and hostile ``submit`` inputs go in between: each refused (400 / exit
2), nothing written for them. A second test SIGKILLs ``opstate retry --once`` processes and serve
at random points and between a child's create and its store write, and starts them again on the
file as it was left. Both end with: every acknowledged policy in the file, at most one batch at
the fake per planned id, every root final with one line per input key as the rule says,
``integrity_check`` ok, and no process touching the store's files other than through SQLite
(``file_checks.audit_env``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from opstate.retry import lineage
from tests.reliability.file_checks import Watch, audit_env, integrity, outside_sqlite, problems
from tests.reliability.sharing import (
    Ack,
    Acks,
    Command,
    http_send,
    judge,
    start_loops,
    stop_all,
    summary,
)
from tests.support.ca_file import plain_http_env
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import answered, failed, input_keys, request_bytes, request_line
from tests.support.serve_process import OPSTATE, ServeProcess, cli_env, run_cli, start_serve

RETRY_TOKEN = "opstate-test-retry-token-fedcba9876543210"  # test-only

MODEL = "gemini-2.5-flash"
STATUS = {503: "UNAVAILABLE", 400: "INVALID_ARGUMENT"}
ATTEMPT = re.compile(r"-a(\d+)-\d+$")
# A planned child's display name: a one-way tag of its nonce id (issues 38, 47).
PLANNED_ID = re.compile(r"^opstate-retry-[0-9a-f]{12}-a\d+-\d+$")


# -- the truth at the fake ----------------------------------------------------------------------


def outcome(key: str, attempt: int) -> int:
    """What Gemini answers for ``key`` at ``attempt``: 0 (an answer), 503 or 400 (attempt 0)."""
    h = int(hashlib.sha256(f"{key}|{attempt}".encode()).hexdigest()[:8], 16)
    if attempt == 0 and h % 11 == 0:
        return 400
    return 503 if h % 100 < 40 else 0


def expected(key: str, max_attempts: int) -> tuple[int, int]:
    """(code, attempt) of ``key``'s final line: its first answer or permanent failure, else
    its 503 at the last attempt the policy allows."""
    for attempt in range(max_attempts + 1):
        code = outcome(key, attempt)
        if code != 503:
            return code, attempt
    return 503, max_attempts


def output_row(key: str, attempt: int) -> dict[str, Any]:
    code = outcome(key, attempt)
    return answered(key) if code == 0 else failed(key, code, STATUS[code])


class GeminiSide:
    """Runs every batch the fake holds: a created one (its keys from its uploaded input, its
    attempt from its display name) and a released one (created elsewhere, attempt 0): RUNNING
    when first seen, SUCCEEDED with its output rows on a later look."""

    def __init__(self, fake: FakeGemini) -> None:
        self.fake = fake
        self.lock = threading.Lock()
        self.released: dict[str, list[str]] = {}
        self.running: set[str] = set()
        self.done: set[str] = set()

    def release(self, name: str, keys: list[str]) -> None:
        with self.lock:
            self.released[name] = keys

    def step(self) -> None:
        with self.lock:
            released = dict(self.released)
        for name in [*self.fake.batches_created(), *released]:
            resource = self.fake.resource(name)
            if name in self.done or resource is None:  # not there yet: created, not yet put
                continue
            if name not in self.running:
                self.fake.set_batch_state(name, "BATCH_STATE_RUNNING")
                self.running.add(name)
                continue
            if name in released:
                keys, attempt = released[name], 0
            else:
                keys = input_keys(self.fake.batch_input(name))
                found = ATTEMPT.search(display_id(resource))
                attempt = int(found.group(1)) if found else 0
            self.fake.run_batch(name, [output_row(k, attempt) for k in keys])
            self.done.add(name)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(0.05):
            self.step()


def display_id(resource: dict[str, Any]) -> str:
    """The last word of a batch's display name: its submit id or planned child id."""
    words = str(resource.get("metadata", {}).get("displayName") or "").split()
    return words[-1] if words else ""


def created_per_id(fake: FakeGemini) -> Counter[str]:
    """How many batches the fake created under each display id."""
    return Counter(display_id(fake.resource(n) or {}) for n in fake.batches_created())


# -- the roots and what was acknowledged --------------------------------------------------------


@dataclass(frozen=True)
class Root:
    name: str
    keys: tuple[str, ...]
    max_attempts: int
    via: str


@dataclass
class Run:
    """One run's shared state: its folder, file, environment, fake and acknowledgements."""

    folder: Path
    fake: FakeGemini
    gemini: GeminiSide
    env: dict[str, str | None]
    acks: Acks = field(default_factory=Acks)
    roots: list[Root] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # names a hostile request named
    refused_inputs: list[bytes] = field(default_factory=list)

    @property
    def db(self) -> Path:
        return self.folder / "ops.db"

    @property
    def store(self) -> str:
        return f"sqlite:///{self.db}"

    def add_root(self, root: Root, answer: dict[str, Any], via: str) -> None:
        with self.acks.lock:
            self.roots.append(root)
        version = int(answer.get("version") or 1)
        self.acks.add(Ack(root.name, version, str(answer.get("state") or "PENDING"), None, via))

    def root_names(self) -> list[str]:
        with self.acks.lock:
            return [r.name for r in self.roots]

    def cli(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run_cli(
            [*argv, "--store", self.store], cwd=self.folder, env=self.env, timeout=timeout
        )


def make_run(folder: Path, fake: FakeGemini, **extra: str) -> Run:
    db = folder / "ops.db"
    env: dict[str, str | None] = {
        "GEMINI_API_KEY": "test-key",
        "GOOGLE_GEMINI_BASE_URL": fake.base_url,
        "OPSTATE_RECONCILE_MAX_PAGES": "0",
        "OPSTATE_RETRY_CHECK_SECONDS": "1",
        # The PUTs with "retry" hold the retry right (issue 38; the API token alone is a 403).
        "OPSTATE_RETRY_API_TOKEN": RETRY_TOKEN,
        "OPSTATE_RESULTS_URL": (folder / "results").as_uri(),
        "OPSTATE_WEBHOOK_SECRETS": None,
        **audit_env(folder, db),
        # The fake speaks plain HTTP: each process's google-genai clients load one CA
        # certificate, not certifi's bundle, for TLS contexts nothing uses (issue 49).
        **plain_http_env(folder),
        **extra,
    }
    return Run(folder, fake, GeminiSide(fake), env)


def keys_of(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:02d}" for i in range(n)]


def submit_good(run: Run, i: int, n_keys: int = 12) -> None:
    keys = keys_of(f"s{i}", n_keys)
    source = run.folder / f"in-{i}.jsonl"
    source.write_bytes(b"".join(request_bytes(k) for k in keys))
    argv = ["submit", str(source), "--model", MODEL, "--retry-attempts", "2", "--json"]
    result = run.cli(argv)
    run.acks.ran("submit")
    if result.returncode != 0:
        run.acks.error(f"submit {i}: exit {result.returncode}: {result.stderr[-600:]}")
        return
    answer = json.loads(result.stdout)
    run.add_root(Root(answer["name"], tuple(keys), 2, "submit"), answer, "cli submit")


def track_good(run: Run, i: int) -> None:
    name = f"batches/elsewhere-{i}"
    keys = keys_of(f"t{i}", 10)
    run.fake.put_batch(name, "BATCH_STATE_PENDING")
    source = run.folder / f"elsewhere-{i}.jsonl"
    source.write_bytes(b"".join(request_bytes(k) for k in keys))
    attempts = 1 + i % 2
    argv = ["track", name, "--retry-attempts", str(attempts), "--input", str(source), "--json"]
    result = run.cli(argv)
    run.acks.ran("track")
    if result.returncode != 0:
        run.acks.error(f"track {name}: exit {result.returncode}: {result.stderr[-600:]}")
        return
    run.add_root(Root(name, tuple(keys), attempts, "track"), json.loads(result.stdout), "track")
    run.gemini.release(name, keys)


def inlined_batch(fake: FakeGemini, name: str, keys: list[str]) -> None:
    """A batch created elsewhere with keyed inlined requests (its input is in the job)."""
    fake.put_batch(name, "BATCH_STATE_PENDING")
    body = fake.resource(name)
    assert body is not None
    requests = [{"request": request_line(k)["request"], "metadata": {"key": k}} for k in keys]
    body["metadata"]["inputConfig"] = {"requests": {"requests": requests}}
    fake.put(name, body)


def put(url: str, name: str, body: bytes) -> tuple[int, Any]:
    headers = {"content-type": "application/json", "Authorization": f"Bearer {RETRY_TOKEN}"}
    return http_send(url, "PUT", f"/operations/{name}", body, headers)


def put_good(run: Run, url: Callable[[], str], i: int) -> None:
    name = f"batches/inlined-{i}"
    keys = keys_of(f"p{i}", 8)
    inlined_batch(run.fake, name, keys)
    body = json.dumps({"retry": {"maxAttempts": 2}}).encode()
    deadline = time.monotonic() + 30
    status, answer = put(url(), name, body)
    while status in (0, 503) and time.monotonic() < deadline:  # serve restarting
        time.sleep(0.2)
        status, answer = put(url(), name, body)
    run.acks.status(status)
    if status != 200 or (answer.get("retry") or {}).get("policy", {}).get("maxAttempts") != 2:
        run.acks.error(f"PUT {name}: {status} {answer!r}")
        return
    run.add_root(Root(name, tuple(keys), 2, "put"), answer, "http put")
    run.gemini.release(name, keys)


# -- hostile requests ---------------------------------------------------------------------------

HOSTILE_RETRY: list[object] = [
    [],
    None,
    "2",
    {"maxAttempts": 11},
    {"maxAttempts": -1},
    {"maxAttempts": True},
    {"maxAttempts": "2"},
    {"maxAttempts": 2.5},
    {"bogus": 1},
    {"resubmitExpired": "yes"},
    {"pendingTimeoutHours": 0},
    {"pendingTimeoutHours": 721},
    {"input": "file:///etc/passwd"},
    {"input": "/etc/passwd"},
    {"input": "s3://"},
]


def hostile_bodies() -> Iterator[bytes]:
    for n in itertools.count():
        retry = HOSTILE_RETRY[n % len(HOSTILE_RETRY)]
        yield json.dumps({"state": "SUCCEEDED", "retry": retry}).encode()
        if n % 5 == 4:
            yield b'{"retry": {"maxAttempts": 2}, "state": "\xff\xfe"}'  # not UTF-8


def put_hostile(run: Run, url: str, name: str, body: bytes, *, track_name: bool) -> None:
    status, answer = put(url, name, body)
    run.acks.ran("hostile put")
    if track_name:
        with run.acks.lock:
            run.refused.append(name)
    if status in (0, 503):
        return  # serve not there (restarting): nothing was asked
    if status != 400:
        run.acks.error(f"hostile PUT {name} {body[:80]!r}: {status} {answer!r}")


def hostile_inputs(i: int) -> list[bytes]:
    """Inputs ``submit`` must refuse, each unlike any other (a key carries ``i``)."""
    good = request_bytes(f"h{i}-ok")
    return [
        good + b'{"key": "h%d-x", "request": ' % i,  # not JSON
        good + request_bytes(f"h{i}-ok"),  # a duplicate key
        good + b'{"key": "h%d-\xff", "request": {}}\n' % i,  # not UTF-8
        good + b"\n" + request_bytes(f"h{i}-b"),  # a blank line
        good + json.dumps({"request": {"x": i}}).encode() + b"\n",  # no key
        good + json.dumps({"key": "k" * 513, "request": {"x": i}}).encode() + b"\n",
        good + json.dumps({"key": f"h{i}-r", "request": [i]}).encode() + b"\n",
        json.dumps([f"h{i}"]).encode() + b"\n",
    ]


def submit_hostile(run: Run, i: int, data: bytes) -> None:
    source = run.folder / f"hostile-{i}.jsonl"
    source.write_bytes(data)
    with run.acks.lock:
        run.refused_inputs.append(data)
    result = run.cli(["submit", str(source), "--model", MODEL, "--retry-attempts", "2", "--json"])
    run.acks.ran("hostile submit")
    if result.returncode != 2 or "nothing submitted" not in result.stderr:
        said = f"exit {result.returncode}: {result.stderr[-300:]} {result.stdout[:200]}"
        run.acks.error(f"hostile submit {data[:60]!r}: {said}")


# -- the end of a run ---------------------------------------------------------------------------


def retry_rows(db: Path) -> dict[str, tuple[str | None, dict[str, Any] | None]]:
    conn = sqlite3.connect(db, timeout=10)
    try:
        rows = conn.execute("SELECT name, retry_status, retry FROM operations").fetchall()
    finally:
        conn.close()
    # the column holds {"status", "created_ns", "rev", "due_ns", "doc"}
    return {
        name: (status, json.loads(text)["doc"] if text else None) for name, status, text in rows
    }


def all_final(run: Run) -> bool:
    rows = retry_rows(run.db)
    for root in list(run.roots):
        status, doc = rows.get(root.name, (None, None))
        if status != "done" or doc is None or (doc.get("final") or {}).get("status") != "final":
            return False
    return True


def wait_until(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.3)
    return check()


def local_path(location: str) -> Path:
    return Path(unquote(urlparse(location).path))


def final_problems(doc: dict[str, Any], root: Root) -> list[str]:
    """``root``'s final result against the rule: one line per input key, each as expected."""
    final = doc["final"]
    lines = [json.loads(x) for x in local_path(str(final["location"])).read_bytes().splitlines()]
    got = {line["key"]: line for line in lines}
    if len(lines) != len(root.keys) or set(got) != set(root.keys):
        return [f"{root.name}: {len(lines)} final lines for {len(root.keys)} keys"]
    out = []
    for key in root.keys:
        code, attempt = expected(key, root.max_attempts)
        line = got[key]
        seen = 0 if "response" in line else int((line.get("error") or {}).get("code", -1))
        if (seen, line.get("attempt")) != (code, attempt):
            out.append(f"{root.name} {key}: {seen} at {line.get('attempt')}, not {code}, {attempt}")
    want = Counter(expected(k, root.max_attempts)[0] for k in root.keys)
    rows = {"total": len(root.keys), "answered": want[0], "blocked": 0}
    rows["failed"] = len(root.keys) - want[0]
    errors = {str(c): n for c, n in want.items() if c}
    if (final["rows"], final["errors"] or {}) != (rows, errors):
        out.append(f"{root.name}: final counts {final['rows']} {final['errors']}, not {rows}")
    return out


def end_problems(run: Run) -> list[str]:
    """Every retry check of a finished run, each a line (empty: none)."""
    rows = retry_rows(run.db)
    per_id = created_per_id(run.fake)
    twice = {i: n for i, n in per_id.items() if n > 1}
    out = [f"created more than once at the fake: {twice}"] if twice else []
    planned: set[str] = set()
    for root in run.roots:
        out += root_problems(root, rows.get(root.name, (None, None)), planned)
    unplanned = {i for i in per_id if PLANNED_ID.match(i)} - planned
    if unplanned:
        out.append(f"children no plan names: {sorted(unplanned)[:4]}")
    return out + refused_problems(run, rows) + outside_sqlite(run.folder)


def root_problems(
    root: Root, row: tuple[str | None, dict[str, Any] | None], planned: set[str]
) -> list[str]:
    """An acknowledged root: its policy kept, its lineage done, every planned child created
    (its id added to ``planned``), its final result as the rule says."""
    status, doc = row
    if doc is None:
        return [f"{root.name} ({root.via}): acknowledged, no retry state in the file"]
    out = []
    if doc["policy"]["maxAttempts"] != root.max_attempts:
        out.append(f"{root.name}: policy {doc['policy']}, {root.max_attempts} acknowledged")
    if status != "done" or doc["final"]["status"] != "final":
        return [*out, f"{root.name}: {status}, final {doc['final']['status']}"]
    for child in doc["children"]:
        planned.add(lineage.public_name(child["id"]))
        if child["phase"] != "created" or not child["name"]:
            out.append(f"{root.name}: child {child['id']} left {child['phase']}")
    return out + final_problems(doc, root)


def refused_problems(
    run: Run, rows: dict[str, tuple[str | None, dict[str, Any] | None]]
) -> list[str]:
    """Nothing written for a refused request: no record, no input at the fake or kept."""
    out = []
    refused = sorted(n for n in set(run.refused) if n in rows)
    if refused:
        out.append(f"a refused PUT left a record: {refused[:4]}")
    uploads = {run.fake.batch_input(n) for n in run.fake.batches_created()}
    sent = [data[:60] for data in run.refused_inputs if data in uploads]
    if sent:
        out.append(f"a refused input reached the fake: {sent[:3]}")
    held = {p.read_bytes() for p in (run.folder / "results" / "inputs").glob("*/input.jsonl")}
    if any(data in held for data in run.refused_inputs):
        out.append("a refused input was kept in the results")
    return out


# -- 1 and 3: everything at once, hostile requests in between ----------------------------------

SUBMITS, TRACKS, PUTS = 5, 3, 3


def retry_commands() -> Iterator[Command]:
    return itertools.repeat(("retry", ["retry", "--once"]))


def reader_commands(run: Run) -> Iterator[Command]:
    for n in itertools.count():
        names = run.root_names() or ["batches/none-yet"]
        name = names[n % len(names)]
        yield "get-any", ["get", name, "--json"]
        yield "results", ["results", name, "--json"]


def produce(run: Run, url: Callable[[], str], stop: threading.Event) -> None:
    """The good submits, each in a thread of its own, and the tracks and PUTs, with hostile
    PUTs between them (new names, roots already acknowledged, and a retry child once there is
    one). The submits one after another took most of the run's wall time, and the retry and
    reader loops beside them spend CPU for as long as the run lasts (issue 49)."""
    submits = [threading.Thread(target=submit_good, args=(run, i)) for i in range(SUBMITS)]
    for submit in submits:
        submit.start()
    try:
        between(run, url, stop)
    finally:
        for submit in submits:
            submit.join(timeout=120)
    if wait_until(lambda: bool(children_in(run.db)), 30):
        child = children_in(run.db)[0]
        body = json.dumps({"state": "SUCCEEDED", "retry": {"maxAttempts": 1}}).encode()
        put_hostile(run, url(), child, body, track_name=False)
        if retry_rows(run.db)[child][0] != "member":
            run.acks.error(f"a refused PUT changed the retry state of child {child}")


def between(run: Run, url: Callable[[], str], stop: threading.Event) -> None:
    """The tracks and PUTs, and the hostile PUTs (``produce``)."""
    bodies = hostile_bodies()
    for i in range(max(SUBMITS, TRACKS, PUTS)):
        if stop.is_set():
            return
        for j in range(3):
            put_hostile(run, url(), f"batches/hostile-{i}-{j}", next(bodies), track_name=True)
        if i < TRACKS:
            track_good(run, i)
        for name in run.root_names()[-2:]:
            put_hostile(run, url(), name, next(bodies), track_name=False)
        if i < PUTS:
            put_good(run, url, i)


def children_in(db: Path) -> list[str]:
    return sorted(n for n, (status, _) in retry_rows(db).items() if status == "member")


# Two rounds refuse every kind of hostile input once (an even round takes one half of the
# kinds, an odd round the other): more rounds were the same refusals again, each a process.
HOSTILE_ROUNDS = 2


def submit_hostiles(run: Run, stop: threading.Event) -> None:
    for i in range(HOSTILE_ROUNDS):
        for data in hostile_inputs(i)[i % 2 :: 2]:
            if stop.is_set():
                return
            submit_hostile(run, i, data)


@pytest.mark.timeout(240)
def test_every_retry_writer_at_once_on_one_file(tmp_path: Path) -> None:
    with FakeGemini() as fake:
        run = make_run(tmp_path, fake)
        server = start_serve(
            ["--store", run.store, "--reconcile-every", "0.3"], cwd=tmp_path, env=run.env
        )
        stop = threading.Event()
        started = time.monotonic()
        try:
            with Watch(run.db, lambda: [server.process.pid]) as watch:
                threads = [threading.Thread(target=run.gemini.run, args=(stop,), daemon=True)]
                threads[0].start()
                threads += start_loops(
                    2, run.store, tmp_path, run.acks, stop, lambda i: retry_commands(), run.env
                )
                threads += start_loops(
                    1, run.store, tmp_path, run.acks, stop, lambda i: reader_commands(run), run.env
                )
                writers = [
                    threading.Thread(target=produce, args=(run, lambda: server.url, stop)),
                    threading.Thread(target=submit_hostiles, args=(run, stop)),
                ]
                for w in writers:
                    w.start()
                for w in writers:
                    w.join(timeout=120)
                finished = wait_until(lambda: all_final(run), 90)
                took = time.monotonic() - started
                stop_all(stop, threads, timeout=60)
            code = server.terminate()
        finally:
            stop.set()
            server.kill()
        said = f"{summary(run.acks)}; {len(fake.batches_created())} batches; final in {took:.1f} s"
        print(said)
        found = problems(run.acks, run.db, watch=watch, extra=[] if code == 0 else [f"exit {code}"])
        found += end_problems(run)
        created = created_per_id(fake)
    assert found == [], said
    assert finished, said
    assert len(run.roots) == SUBMITS + TRACKS + PUTS, said
    assert sum(1 for i in created if PLANNED_ID.match(i)) > 3, f"few retry children: {created}"
    assert run.acks.commands.get("hostile put", 0) > 20 and run.acks.commands.get("retry"), said
    assert run.acks.commands["hostile submit"] == 4 * HOSTILE_ROUNDS, said  # every kind once
    output = server.output()
    assert "retry_submitted=" in output, output[-2000:]


# -- 2: kill -9 of the retry passes and of serve ------------------------------------------------

KILLS = 6
CREATE_KILLS = 2  # kills between a child's create at Gemini and its name in the store


@dataclass
class Killer:
    """The retry processes and serve of a run, killed with SIGKILL and started again."""

    run: Run
    servers: list[ServeProcess]
    rng: random.Random
    live: set[subprocess.Popen[str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    killed: Counter[str] = field(default_factory=Counter)
    kills_done: threading.Event = field(default_factory=threading.Event)
    found: list[str] = field(default_factory=list)

    def serve(self) -> ServeProcess:
        args = ["--store", self.run.store, "--reconcile-every", "0.3"]
        return start_serve(args, cwd=self.run.folder, env=self.run.env)

    def url(self) -> str:
        return self.servers[-1].url

    def pids(self) -> list[int]:
        return [s.process.pid for s in self.servers if s.process.poll() is None]

    def retry_loop(self, stop: threading.Event) -> None:
        argv = ["retry", "--once", "--store", self.run.store]
        while not stop.is_set():
            process = subprocess.Popen(
                [*OPSTATE, *argv],
                cwd=self.run.folder,
                env=cli_env(self.run.env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            with self.lock:
                self.live.add(process)
            out, err = process.communicate(timeout=60)
            with self.lock:
                self.live.discard(process)
            if process.returncode == -signal.SIGKILL:
                continue
            result = subprocess.CompletedProcess(argv, process.returncode, out, err)
            judge("retry", argv, result, self.run.acks)

    def kill_retries(self, why: str) -> None:
        with self.lock:
            victims = list(self.live)
        for process in victims:
            process.kill()
            self.killed[why] += 1

    def kill_serve(self) -> None:
        server = self.servers[-1]
        if server.process.poll() is None:
            server.process.kill()
            self.killed["serve"] += 1
        server.process.wait(timeout=10)

    def on_create(self, name: str) -> None:
        """The fake's create hook: the first ``CREATE_KILLS`` child creates kill every retry
        process and serve before the answer leaves, so whoever created it never hears of it."""
        if not PLANNED_ID.match(display_id(self.run.fake.resource(name) or {})):
            return
        with self.lock:
            if self.killed["at create"] >= CREATE_KILLS:
                return
            self.killed["at create"] += 1
        self.kill_retries("retry at create")
        self.kill_serve()

    def check(self, after: str) -> None:
        checked = integrity(self.run.db)
        if checked != "ok":
            self.found.append(f"integrity after {after}: {checked[:200]}")

    def chaos(self, stop: threading.Event) -> None:
        """``KILLS`` kills at random points (every other one serve's), then serve is kept up;
        a serve found dead (here or by ``on_create``) is started again on the file as left."""
        kills = 0
        while not stop.wait(self.rng.uniform(0.3, 1.0)):
            if kills < KILLS:
                kills += 1
                if kills % 2 == 0:
                    self.kill_serve()
                else:
                    self.kill_retries("retry")
                self.check(f"kill {kills}")
            else:
                self.kills_done.set()
            if self.servers[-1].process.poll() is not None:
                self.check("a serve kill")
                self.servers.append(self.serve())


@pytest.mark.timeout(240)
def test_kill_9_of_retry_passes_and_serve_leaves_one_child_per_plan(tmp_path: Path) -> None:
    with FakeGemini() as fake:
        # A pass killed mid-claim holds its child (or its archive) until the lease runs out.
        leases = {"OPSTATE_RETRY_LEASE_SECONDS": "2", "OPSTATE_RESULTS_LEASE_SECONDS": "2"}
        run = make_run(tmp_path, fake, **leases)
        killer = Killer(run, [], random.Random(33))
        killer.servers.append(killer.serve())
        fake.on_create(killer.on_create)
        stop, chaos_stop = threading.Event(), threading.Event()
        started = time.monotonic()
        try:
            with Watch(run.db, killer.pids, sides=False) as watch:
                threads = [
                    threading.Thread(target=f, args=(e,), daemon=True)
                    for f, e in (
                        (run.gemini.run, stop),
                        (killer.retry_loop, stop),
                        (killer.retry_loop, stop),
                        (killer.chaos, chaos_stop),
                    )
                ]
                for t in threads:
                    t.start()
                for i in range(4):
                    submit_good(run, i)
                track_good(run, 0)
                put_good(run, killer.url, 0)
                wait_until(lambda: killer.killed["at create"] >= CREATE_KILLS, 60)
                killer.kills_done.wait(60)
                finished = wait_until(lambda: all_final(run), 90)
                took = time.monotonic() - started
                stop_all(chaos_stop, threads[3:], timeout=30)
                stop_all(stop, threads[:3], timeout=60)
            fake.on_create(None)
            code = killer.servers[-1].terminate()
        finally:
            stop.set()
            chaos_stop.set()
            for server in killer.servers:
                server.kill()
        said = (
            f"{summary(run.acks)}; killed {dict(killer.killed)}, {len(killer.servers)} serves; "
            f"{len(fake.batches_created())} batches; final in {took:.1f} s"
        )
        print(said)
        found = problems(run.acks, run.db, watch=watch, extra=killer.found)
        found += [] if code == 0 else [f"serve exit {code}"]
        found += end_problems(run)
    assert found == [], said
    assert finished, said
    assert killer.killed["at create"] == CREATE_KILLS and killer.killed["serve"] >= 3, said
    assert len(killer.servers) == 1 + killer.killed["serve"], said
    assert killer.killed["retry"] >= 1 and len(run.roots) == 6, said


def test_the_audit_sees_a_python_open_of_the_store(tmp_path: Path) -> None:
    """The check of both runs sees what it looks for: a process that opens the database with
    Python's ``open`` is named."""
    db = tmp_path / "ops.db"
    db.write_bytes(b"")
    env = audit_env(tmp_path, db)
    code = f"open({str(db) + '-wal'!r}, 'ab').close(); open({str(db)!r}, 'rb').close()"
    subprocess.run([sys.executable, "-c", code], env=cli_env(env), check=True, timeout=30)
    assert [line.split(" by ")[0] for line in outside_sqlite(tmp_path)] == [
        f"open {db}-wal",
        f"open {db}",
    ]
