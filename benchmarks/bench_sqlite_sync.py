"""The cost of ``synchronous=FULL`` for the SQLite store (issue 24): the same ingests with
``NORMAL`` (a commit survives a crash of the process, not a power loss) and ``FULL`` (the WAL
is fsync'ed at every commit: a 200 survives power loss).

Each round ingests N new operations (``ingest``: read, reduce, conditional write, one commit
each) into a fresh file in a temporary directory on the disk the store would use (``--dir``,
default the system's temporary directory; a tmpfs would hide the fsync). Rounds alternate
(NORMAL, FULL, NORMAL, ...) and each mode's figure is its median round.

    .venv/bin/python benchmarks/bench_sqlite_sync.py [--n 300] [--rounds 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for entry in (str(HERE.parent), str(HERE.parent / "layers" / "opstate")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from opstate.domain.events import Source  # noqa: E402
from opstate.domain.model import OpEvent  # noqa: E402
from opstate.domain.states import State  # noqa: E402
from opstate.ingest import ingest  # noqa: E402
from opstate.store import sqlite as sqlite_store  # noqa: E402

T0_NS = 1_780_000_000 * 1_000_000_000


def one_round(mode: str, n: int, where: Path) -> dict[str, float]:
    """N ingests of new operations with ``synchronous=<mode>``: per-commit latencies."""
    sqlite_store.SYNCHRONOUS = mode
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        store = sqlite_store.SQLiteStore(Path(tmp) / "ops.db")
        try:
            assert store._conn().execute("PRAGMA synchronous").fetchone()[0] == (
                2 if mode == "FULL" else 1
            )
            latencies = []
            started = time.perf_counter()
            for i in range(n):
                event = OpEvent(f"batches/s{i}", State.RUNNING, T0_NS + i, Source.REPORT, {})
                begin = time.perf_counter()
                ingest(store, event)
                latencies.append(time.perf_counter() - begin)
            elapsed = time.perf_counter() - started
        finally:
            store.close()
    latencies.sort()
    return {
        "per_s": n / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def run(n: int, rounds: int, where: Path) -> dict[str, Any]:
    saved = sqlite_store.SYNCHRONOUS
    results: dict[str, list[dict[str, float]]] = {"NORMAL": [], "FULL": []}
    try:
        for _ in range(rounds):
            for mode in ("NORMAL", "FULL"):
                results[mode].append(one_round(mode, n, where))
    finally:
        sqlite_store.SYNCHRONOUS = saved
    out: dict[str, Any] = {"n": n, "rounds": rounds, "dir": str(where)}
    for mode, runs in results.items():
        out[mode] = {key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]}
    out["full_over_normal_p50"] = round(out["FULL"]["p50_ms"] / out["NORMAL"]["p50_ms"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args(argv)
    print(json.dumps(run(args.n, args.rounds, args.dir), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
