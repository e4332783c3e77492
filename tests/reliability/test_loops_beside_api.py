"""The reconciler and the archiver write beside the API, in serve and in other processes
(issue 30).

Forty batches run at a fake Gemini and end one after another, one every 0.15 s (SUCCEEDED with an
output file to archive, or FAILED). ``opstate serve`` polls them every 0.5 s and archives what
ended, while the test reports them RUNNING and delivers each end as a signed webhook, and another
thread runs ``opstate reconcile --once``, ``archive --once``, ``refresh``, ``get`` and
``results`` in a loop, each a new process. Three observers read the records all along (serve's
GET, ``opstate get``, a plain sqlite3 connection): no observer ever sees a record's version or
state go backwards, and the file at the end holds every acknowledged write and everything an
observer saw.
"""

from __future__ import annotations

import itertools
import json
import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest

from opstate.domain.states import RANK, State, parse_state
from opstate.domain.times import format_time
from tests.reliability.file_checks import Watch, problems
from tests.reliability.sharing import (
    Ack,
    Acks,
    Command,
    deliver,
    http_send,
    judge,
    stop_all,
    summary,
)
from tests.reliability.support import SECRET, Delivery
from tests.support.fake_gemini import FakeGemini
from tests.support.outcomes import batch_output
from tests.support.serve_process import run_cli, start_serve

BATCHES = 40
END_EVERY_S = 0.15  # the batches end one after another over about 6 s
NS = 1_000_000_000


@dataclass
class Observer:
    """What one reader saw, in its own order: a record's (version, rank) must never drop."""

    who: str
    acks: Acks
    last: dict[str, tuple[int, int]] = field(default_factory=dict)
    backwards: list[str] = field(default_factory=list)
    reads: int = 0

    def see(self, name: str, version: int, state: str) -> None:
        self.reads += 1
        now = (version, RANK[parse_state(state)])
        before = self.last.get(name)
        if before is not None and (now[0] < before[0] or now[1] < before[1]):
            self.backwards.append(f"{self.who}: {name} v{before[0]} -> v{now[0]} {state}")
        if before != now:
            self.last[name] = now
            self.acks.add(Ack(name, version, state, None, f"seen by {self.who}"))


class Gemini:
    """The batches' truth at the fake: RUNNING with progress, then each ends in turn."""

    def __init__(self, fake: FakeGemini, names: Sequence[str]) -> None:
        self.fake = fake
        self.names = list(names)
        self.started_ns = time.time_ns() - 60 * NS
        data, _ = batch_output(5, {})
        for i, name in enumerate(self.names):
            fake.put_batch(name, "RUNNING", update_time=format_time(self.started_ns))
            body = fake.resource(name) or {}
            body["metadata"]["batchStats"] = {"requestCount": "5", "pendingRequestCount": "5"}
            fake.put(name, body)
            fake.put_file(
                f"out-{i}", body=data, expiration_time=format_time(time.time_ns() + 86400 * NS)
            )

    def end(self, i: int) -> Delivery:
        """End batch ``i`` now; the webhook Gemini would send about it."""
        name = self.names[i]
        state = State.FAILED if i % 5 == 4 else State.SUCCEEDED
        ns = time.time_ns()
        text = format_time(ns)
        if state is State.SUCCEEDED:
            self.fake.put_batch(
                name, "SUCCEEDED", update_time=text, responses_file=f"files/out-{i}"
            )
        else:
            self.fake.put_batch(
                name, "FAILED", update_time=text, error={"code": 13, "message": "x"}
            )
        return Delivery(name, state, text, ns)

    def running_report(self, rng: random.Random) -> Delivery:
        name = rng.choice(self.names)
        ns = self.started_ns + rng.randrange(1, 50) * 1_000_000
        return Delivery(name, State.RUNNING, format_time(ns), ns)


def gemini_side(
    gemini: Gemini, url: str, acks: Acks, stop: threading.Event, every_s: float
) -> None:
    """End the batches one by one, delivering each end as a webhook; RUNNING reports between."""
    rng = random.Random(7)
    for i in range(len(gemini.names)):
        if stop.wait(every_s):
            return
        deliver(lambda: url, gemini.end(i), acks, stop)
        for _ in range(3):
            deliver(lambda: url, gemini.running_report(rng), acks, stop)


def watch_over_http(url: str, names: Sequence[str], seen: Observer, stop: threading.Event) -> None:
    while not stop.wait(0.05):
        for name in names:
            status, record = http_send(url, "GET", "/operations/" + quote(name, safe="/"), None, {})
            if status == 200:
                seen.see(name, int(record["version"]), str(record["state"]))
            elif status not in (404, 503):  # not tracked yet; retry later
                seen.acks.error(f"GET {name}: {status} {record!r}")


def watch_the_file(db: Path, seen: Observer, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        conn = sqlite3.connect(db, timeout=10)
        try:
            rows = conn.execute("SELECT name, version, state FROM operations").fetchall()
        except sqlite3.Error as exc:
            seen.acks.error(f"plain sqlite3 read: {exc}")
            rows = []
        finally:
            conn.close()
        for name, version, state in rows:
            seen.see(name, int(version), state)


def loop_commands(names: Sequence[str]) -> Iterator[Command]:
    for n in itertools.count():
        name = names[(n * 7) % len(names)]
        yield "reconcile", ["reconcile", "--once", "--budget", "20"]
        yield "refresh", ["refresh", name, "--json"]
        yield "archive", ["archive", "--once"]
        yield "observe", ["get", name, "--json"]
        yield "results", ["results", name, "--json"]


KINDS = frozenset(kind for kind, _ in itertools.islice(loop_commands(["x"]), 5))


def command_loop(
    names: Sequence[str],
    store: str,
    cwd: Path,
    env: dict[str, str | None],
    seen: Observer,
    stop: threading.Event,
) -> None:
    done: set[str] = set()
    for kind, argv in loop_commands(names):
        # One whole round (every kind at least once) runs even when the Gemini side ends
        # first: on a loaded CI machine each CLI call can take seconds, and the last
        # fresh-clone run stopped after reconcile and refresh, so `get` had never been run.
        if stop.is_set() and done >= KINDS:
            return
        done.add(kind)
        result = run_cli([*argv, "--store", store], cwd=cwd, env=env, timeout=60)
        if kind == "observe" and result.returncode == 0:
            record = json.loads(result.stdout)
            seen.see(record["name"], int(record["version"]), record["state"])
        judge("get-any" if kind == "observe" else kind, argv, result, seen.acks)


def archived_and_progress(db: Path) -> tuple[int, int]:
    conn = sqlite3.connect(db)
    try:
        archived = conn.execute(
            "SELECT COUNT(*) FROM operations WHERE archive_status = 'archived'"
        ).fetchone()[0]
        progress = conn.execute(
            "SELECT COUNT(*) FROM operations WHERE progress IS NOT NULL"
        ).fetchone()[0]
    finally:
        conn.close()
    return int(archived), int(progress)


@pytest.mark.timeout(180)
def test_reconcile_and_archive_loops_beside_the_api_never_go_backwards(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    store = f"sqlite:///{db}"
    names = [f"batches/loop-{i:02d}" for i in range(BATCHES)]
    acks, stop = Acks(), threading.Event()
    observers = [Observer(who, acks) for who in ("serve GET", "opstate get", "sqlite3")]
    with FakeGemini() as fake:
        gemini = Gemini(fake, names)
        env: dict[str, str | None] = {
            "GEMINI_API_KEY": "test-key",
            "GOOGLE_GEMINI_BASE_URL": fake.base_url,
            "OPSTATE_WEBHOOK_SECRETS": SECRET,
        }
        server = start_serve(["--store", store, "--reconcile-every", "0.5"], cwd=tmp_path, env=env)
        try:
            with Watch(db, lambda: [server.process.pid]) as watch:
                ending = threading.Thread(
                    target=gemini_side,
                    args=(gemini, server.url, acks, stop, END_EVERY_S),
                    daemon=True,
                )
                threads = [ending] + [
                    threading.Thread(target=f, args=a, daemon=True)
                    for f, a in (
                        (watch_over_http, (server.url, names, observers[0], stop)),
                        (command_loop, (names, store, tmp_path, env, observers[1], stop)),
                        (watch_the_file, (db, observers[2], stop)),
                    )
                ]
                for t in threads:
                    t.start()
                ending.join(timeout=90)
                time.sleep(1.5)  # a pass or two of serve's loops after the last end
                stop_all(stop, threads, timeout=90)
            code = server.terminate()
        finally:
            server.kill()
        output = server.output()
    said = f"{summary(acks)}; reads {[o.reads for o in observers]}"
    print(said)
    backwards = [line for o in observers for line in o.backwards]
    extra = [f"went backwards: {backwards[:5]}"] if backwards else []
    found = problems(acks, db, watch=watch, extra=extra + ([] if code == 0 else [f"exit {code}"]))
    assert found == [], said
    archived, progress = archived_and_progress(db)
    assert archived > 0 and progress > 0, (archived, progress, output[-2000:])
    assert "archive: archived=" in output and "reconcile: discovered=" in output, output[-2000:]
    assert all(o.reads for o in observers) and acks.commands.get("reconcile"), said
