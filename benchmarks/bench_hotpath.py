"""The webhook's hot path against its floor, side by side in one process.

- **handler**: the deployed webhook handler (``create_app(...).resolve``, as ``app.py`` calls it)
  on a ``SQLiteStore``: one signed ``batch.succeeded`` delivery of a new operation each, with
  its log line and EMF metrics written (to /dev/null: writing them is part of the cost);
- **floor**: the same work done bare, per delivery: verify the same Standard Webhooks HMAC
  (``hmac`` + ``base64``, the timestamp window, constant-time compare), parse the body
  (``json.loads``), one read of the name and one insert with ``sqlite3`` on a file with the
  store's journal settings (WAL, the store's ``synchronous`` - ``FULL`` since the store commits
  to disk before a 200 -, its ``wal_autocheckpoint`` and ``journal_size_limit``,
  ``busy_timeout``) and table; ``--synchronous NORMAL`` gives the floor of the earlier runs,
  taken when the store was on ``NORMAL``.

Rounds alternate (floor, handler, floor, ...) on fresh names; each side's figure is the median
round's microseconds per delivery, and ``ratio`` = floor / handler (1.0: the handler costs no
more than the bare work; the target is ``TARGET_RATIO``). The ratio is taken on CPU time
(``time.process_time``: this process's user + system time, the store's file I/O included): on
a machine shared with other jobs the wall time also counts waiting for a CPU, which swung the
wall-time ratio between 0.09 and 0.2 from one run to the next; the wall-time figures are
reported beside it.

``python benchmarks/bench_hotpath.py [--n N] [--rounds R] [--profile]`` prints the JSON
(``--profile``: the handler's top functions by cumulative time instead).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _entry in (str(HERE), str(ROOT), str(ROOT / "layers" / "opstate")):
    if _entry not in sys.path:
        sys.path.insert(0, _entry)

from bench_ingest import SECRET, make_app, quiet_stdout, signed_webhook_events  # noqa: E402

TARGET_RATIO = 0.25
TOLERANCE_S = 300


class Floor:
    """The bare work of one delivery on its own SQLite file (the store's schema and journal
    settings), no opstate code."""

    def __init__(self, path: Path, synchronous: str | None = None) -> None:
        from opstate.store.sqlite import (
            DEFAULT_BUSY_TIMEOUT_S,
            JOURNAL_SIZE_LIMIT_BYTES,
            SYNCHRONOUS,
            WAL_AUTOCHECKPOINT_PAGES,
        )
        from opstate.store.sqlite_schema import SCHEMA as _SCHEMA

        self.key = base64.b64decode(SECRET.removeprefix("whsec_"))
        self.conn = sqlite3.connect(path, timeout=DEFAULT_BUSY_TIMEOUT_S, isolation_level=None)
        self.conn.execute(f"PRAGMA busy_timeout = {int(DEFAULT_BUSY_TIMEOUT_S * 1000)}")
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.synchronous = synchronous or SYNCHRONOUS
        self.conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        self.conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
        self.conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT_BYTES}")
        self.conn.executescript(_SCHEMA)

    def deliver(self, event: dict[str, Any]) -> None:
        headers = event["headers"]
        body = event["body"]
        msg_id = headers["webhook-id"]
        stamp = headers["webhook-timestamp"]
        if abs(time.time() - int(stamp)) > TOLERANCE_S:
            raise ValueError("timestamp")
        signed = f"{msg_id}.{stamp}.{body}".encode()
        expected = base64.b64encode(hmac.new(self.key, signed, hashlib.sha256).digest()).decode()
        if not any(
            hmac.compare_digest(expected, entry.partition(",")[2])
            for entry in headers["webhook-signature"].split()
        ):
            raise ValueError("signature")
        data = json.loads(body)["data"]
        name = data["id"]
        if self.conn.execute("SELECT * FROM operations WHERE name = ?", (name,)).fetchone():
            raise ValueError("exists")
        now = time.time_ns()
        self.conn.execute(
            "INSERT INTO operations (name, state, rank, update_ns, version, kind, source, "
            "details, created_ns, applied_ns, open_ns, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                name,
                "SUCCEEDED",
                3,
                f"{now:021d}",
                1,
                "batch",
                "webhook",
                json.dumps({"output_file_uri": data["output_file_uri"]}),
                now,
                now,
                None,
                int(now // 1_000_000_000) + 90 * 86400,
            ),
        )

    def close(self) -> None:
        self.conn.close()


def measure(n: int = 2000, rounds: int = 5, synchronous: str | None = None) -> dict[str, Any]:
    from opstate.local.apigw import LocalLambdaContext
    from opstate.store.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory(prefix="opstate-hotpath-") as tmp:
        store = SQLiteStore(Path(tmp) / "handler.db")
        floor = Floor(Path(tmp) / "floor.db", synchronous)
        try:
            app, context = make_app(store), LocalLambdaContext()
            handler_us: list[float] = []
            floor_us: list[float] = []
            handler_cpu: list[float] = []
            floor_cpu: list[float] = []
            with quiet_stdout():
                for event in signed_webhook_events("warm", 50):  # unmeasured warm-up of each
                    app.resolve(event, context)
                    floor.deliver(event)
                for r in range(rounds):
                    events = signed_webhook_events(f"floor{r}", n)
                    started, cpu = time.perf_counter(), time.process_time()
                    for event in events:
                        floor.deliver(event)
                    floor_us.append((time.perf_counter() - started) * 1e6 / n)
                    floor_cpu.append((time.process_time() - cpu) * 1e6 / n)
                    events = signed_webhook_events(f"hook{r}", n)
                    started, cpu = time.perf_counter(), time.process_time()
                    for event in events:
                        answer = app.resolve(event, context)
                        if answer["statusCode"] != 200:
                            raise RuntimeError(f"handler answered {answer}")
                    handler_us.append((time.perf_counter() - started) * 1e6 / n)
                    handler_cpu.append((time.process_time() - cpu) * 1e6 / n)
        finally:
            store.close()
            floor.close()
    handler = statistics.median(handler_cpu)
    bare = statistics.median(floor_cpu)
    return {
        "handler_us": round(handler, 1),
        "floor_us": round(bare, 1),
        "ratio": round(bare / handler, 3),
        "handler_wall_us": round(statistics.median(handler_us), 1),
        "floor_wall_us": round(statistics.median(floor_us), 1),
        "wall_ratio": round(statistics.median(floor_us) / statistics.median(handler_us), 3),
        "target_ratio": TARGET_RATIO,
        "floor_synchronous": floor.synchronous,
        "deliveries_per_round": n,
        "rounds": rounds,
        "python": sys.version.split()[0],
    }


def profile(n: int = 2000, sort: str = "cumulative") -> str:
    import cProfile
    import io
    import pstats

    from opstate.local.apigw import LocalLambdaContext
    from opstate.store.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory(prefix="opstate-hotpath-") as tmp:
        store = SQLiteStore(Path(tmp) / "handler.db")
        try:
            app, context = make_app(store), LocalLambdaContext()
            events = signed_webhook_events("prof", n)
            prof = cProfile.Profile()
            with quiet_stdout():
                app.resolve(signed_webhook_events("warm", 1)[0], context)
                prof.enable()
                for event in events:
                    app.resolve(event, context)
                prof.disable()
        finally:
            store.close()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(sort).print_stats(45)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--profile", nargs="?", const="cumulative", choices=("cumulative", "tottime")
    )
    parser.add_argument(
        "--synchronous",
        choices=("FULL", "NORMAL"),
        help="the floor's synchronous setting (default: the store's)",
    )
    args = parser.parse_args()
    if args.profile:
        print(profile(args.n, args.profile))
    else:
        print(json.dumps(measure(args.n, args.rounds, args.synchronous), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
