"""``kill -9`` of ``opstate serve`` mid-load, several times, beside an ``opstate`` command loop on
the same file; each time serve is started again on the file as it was left (no cleanup).

After every kill the file must open and pass ``integrity_check`` and hold every write
acknowledged until then (``synchronous=FULL``: a 200 is on disk before it is sent); at the end,
after a clean stop, every acknowledged write of the whole run (issue 30).
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from tests.reliability.file_checks import Watch, behind, integrity, problems
from tests.reliability.sharing import (
    Acks,
    start_loops,
    start_senders,
    stop_all,
    summary,
    writer_commands,
)
from tests.reliability.support import SECRET, shuffled_deliveries, timelines
from tests.support.serve_process import ServeProcess, start_serve

KILLS = 4
BETWEEN_KILLS_S = 1.2
SERVE_ENV: dict[str, str | None] = {"OPSTATE_WEBHOOK_SECRETS": SECRET}


def kill_and_check(server: ServeProcess, db: Path, acks: Acks) -> list[str]:
    """SIGKILL serve; then the file as it was left: intact, every write acknowledged so far."""
    server.process.kill()
    server.process.wait(timeout=10)
    with acks.lock:
        so_far = list(acks.records)
    checked = integrity(db)
    out = [] if checked == "ok" else [f"integrity after a kill: {checked[:200]}"]
    return out + [f"after a kill: {line}" for line in behind(so_far, db)]


def kill_and_restart(
    servers: list[ServeProcess], db: Path, acks: Acks, stop: threading.Event
) -> list[str]:
    """``KILLS`` times: let the load run, kill -9 serve, check the file, start serve again on
    it (``servers[-1]`` is the one running). Stops at a start that fails, saying why."""
    store = f"sqlite:///{db}"
    found: list[str] = []
    for k in range(1, KILLS + 1):
        if stop.wait(BETWEEN_KILLS_S):
            break
        found += kill_and_check(servers[-1], db, acks)
        try:
            servers.append(start_serve(["--store", store], cwd=db.parent, env=SERVE_ENV))
        except AssertionError as exc:
            last = str(exc).strip().splitlines()[-1]
            return [*found, f"serve did not start again after kill {k}: {last[:300]}"]
    stop.wait(BETWEEN_KILLS_S)
    return found


@pytest.mark.timeout(180)
def test_kill_9_of_serve_mid_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    rng = random.Random(9)
    deliveries = shuffled_deliveries(timelines(600, rng, prefix="kill"), rng, max_copies=2)
    servers = [start_serve(["--store", f"sqlite:///{db}"], cwd=tmp_path, env=SERVE_ENV)]
    acks, stop = Acks(), threading.Event()
    try:
        alive = lambda: [s.process.pid for s in servers if s.process.poll() is None]  # noqa: E731
        with Watch(db, alive, sides=False) as watch:
            threads = start_senders([lambda: servers[-1].url], deliveries, acks, stop, threads=4)
            threads += start_loops(
                1, f"sqlite:///{db}", tmp_path, acks, stop, lambda i: writer_commands("k", tmp_path)
            )
            found = kill_and_restart(servers, db, acks, stop)
            stop_all(stop, threads, timeout=60)
        code = servers[-1].terminate() if servers[-1].process.poll() is None else 0
    finally:
        stop.set()
        for s in servers:
            s.kill()
    print(summary(acks))
    found = problems(acks, db, watch=watch, extra=found + ([] if code == 0 else [f"exit {code}"]))
    assert found == [], summary(acks)
    assert len(servers) == KILLS + 1, "serve was not killed and started again each time"
    assert len(acks.records) > 200 and acks.commands.get("track"), summary(acks)
