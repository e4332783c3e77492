"""One SQLite file, many processes, under load (issue 30).

``opstate serve`` (one, then two on the same file) answers signed webhooks and reports from four
threads while two other threads run ``opstate`` commands in a loop, each a new process (track,
report, get, wait, list, quarantine list, replay of a file and of the quarantine), and a plain
``sqlite3`` process reads the records and writes a table of its own. Then a clean stop, and every
acknowledged write is counted against the file: none lost, the file intact, no process saw
"malformed" or an I/O error, no 5xx but 503 (retry later), the WAL never deleted under serve.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.reliability.file_checks import Watch, problems
from tests.reliability.sharing import (
    Acks,
    Command,
    reader_commands,
    start_loops,
    start_plain_sqlite,
    start_senders,
    stop_all,
    summary,
    wait_for_load,
    writer_commands,
)
from tests.reliability.support import SECRET, shuffled_deliveries, timelines
from tests.support.serve_process import ServeProcess, start_serve

MIN_ACKS = 500  # acknowledged record writes each load reaches before it stops
SERVE_ENV: dict[str, str | None] = {"OPSTATE_WEBHOOK_SECRETS": SECRET}
ALL_COMMANDS = {
    "track",
    "report",
    "wait",
    "get",
    "replay",
    "get-any",
    "list",
    "quarantine list",
    "replay-quarantine",
}


def commands(folder: Path, prefix: str, names: list[str]) -> Callable[[int], Iterator[Command]]:
    """Loop 0 writes, loop 1 reads (and replays the quarantine)."""

    def loop(i: int) -> Iterator[Command]:
        return writer_commands(f"{prefix}-cli", folder) if i == 0 else reader_commands(names)

    return loop


def run_load(
    tmp_path: Path, servers: list[ServeProcess], prefix: str
) -> tuple[Acks, Watch, str, list[str]]:
    """Load every server, the command loops and the plain sqlite3 process until every command
    ran and ``MIN_ACKS`` writes were acknowledged (the load measured in work done: a fixed 6 s
    on top of it was only more of the same); then stop the load (not the servers)."""
    db = tmp_path / "ops.db"
    rng = random.Random(30)
    lines = timelines(600, rng, prefix=prefix)
    deliveries = shuffled_deliveries(lines, rng, max_copies=2)
    acks, stop = Acks(), threading.Event()
    urls = [lambda s=s: s.url for s in servers]
    with Watch(db, lambda: [s.process.pid for s in servers]) as watch:
        threads = start_senders(urls, deliveries, acks, stop, threads=4)
        threads += start_loops(
            2,
            f"sqlite:///{db}",
            tmp_path,
            acks,
            stop,
            commands(tmp_path, prefix, sorted(lines)),
            env=SERVE_ENV,
        )
        plain = start_plain_sqlite(db, tmp_path)
        # each loop did its round at least, and the servers acknowledged more than MIN_ACKS
        wait_for_load(acks, ALL_COMMANDS, MIN_ACKS, timeout=60)
        stop_all(stop, threads, timeout=60)
        rounds, plain_errors = plain.finish()
    said = f"{summary(acks)}, plain sqlite3: {rounds} rounds, {len(plain_errors)} errors"
    return (
        acks,
        watch,
        said,
        [f"the plain sqlite3 process saw: {plain_errors[:3]}"] if plain_errors else [],
    )


@pytest.mark.timeout(180)
def test_serve_under_load_beside_opstate_commands_and_sqlite3(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    server = start_serve(["--store", f"sqlite:///{db}"], cwd=tmp_path, env=SERVE_ENV)
    try:
        acks, watch, said, extra = run_load(tmp_path, [server], "one")
        code = server.terminate()
    finally:
        server.kill()
    print(said)
    found = problems(
        acks, db, watch=watch, extra=extra + ([] if code == 0 else [f"serve exited {code}"])
    )
    assert found == [], said
    assert len(acks.records) > MIN_ACKS and acks.quarantined, said
    assert set(acks.commands) == ALL_COMMANDS, said


@pytest.mark.timeout(180)
def test_two_serves_on_one_file_beside_opstate_commands(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    servers = [
        start_serve(["--store", f"sqlite:///{db}"], cwd=tmp_path, env=SERVE_ENV) for _ in range(2)
    ]
    try:
        acks, watch, said, extra = run_load(tmp_path, servers, "two")
        codes = [s.terminate() for s in servers]
    finally:
        for s in servers:
            s.kill()
    print(said)
    found = problems(
        acks, db, watch=watch, extra=extra + ([] if codes == [0, 0] else [f"exits {codes}"])
    )
    assert found == [], said
    assert len(acks.records) > MIN_ACKS and acks.quarantined, said
