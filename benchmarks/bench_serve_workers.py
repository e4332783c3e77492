"""``opstate serve``'s worker threads, sized by measurement.

The API app on a ``SQLiteStore`` behind the local HTTP server (waitress, as ``opstate serve``
runs it), on 127.0.0.1, for each worker count:

- ``rps``: requests per second answered for ``clients`` concurrent keep-alive clients, each
  sending signed webhooks of new operations and GETs of them in turn (no lock held elsewhere);
- ``stalled_get_ms``: the slowest of a series of GETs sent while another connection holds the
  SQLite write lock for ``hold_s`` and ``writers`` clients keep posting webhooks (each waits on
  the lock in a worker thread): a GET needs a free worker, so too few workers make reads wait
  behind writes.

``python benchmarks/bench_serve_workers.py [--workers 2 4 8 16 32]`` prints the JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _entry in (str(HERE), str(ROOT), str(ROOT / "layers" / "opstate")):
    if _entry not in sys.path:
        sys.path.insert(0, _entry)

from bench_ingest import SECRET, quiet_stdout, signed_webhook_events  # noqa: E402


def _request(conn: http.client.HTTPConnection, event: dict[str, Any]) -> int:
    conn.request(
        event["requestContext"]["http"]["method"],
        event["rawPath"],
        event.get("body"),
        {k: v for k, v in event["headers"].items() if k.lower() != "content-length"},
    )
    response = conn.getresponse()
    response.read()
    return response.status


def _get(path: str) -> dict[str, Any]:
    return {
        "requestContext": {"http": {"method": "GET"}},
        "rawPath": path,
        "body": None,
        "headers": {},
    }


class Served:
    def __init__(self, tmp: Path, workers: int) -> None:
        from opstate.api import create_app
        from opstate.config import Settings
        from opstate.local.http_server import ApiGatewayApp, LocalHTTPServer
        from opstate.local.serve import LocalApp
        from opstate.signatures import StaticSecretsVerifier
        from opstate.store.sqlite import SQLiteStore

        self.db = tmp / f"serve-{workers}.db"
        self.store = SQLiteStore(self.db)
        app = create_app(
            store=self.store,
            verifier=StaticSecretsVerifier([SECRET]),
            settings=Settings(webhook_secrets=(SECRET,)),
            operations_auth=lambda _event: None,  # the local token check is not measured
        )
        wsgi = ApiGatewayApp(LocalApp(app).resolve, say=lambda _line: None)
        self.server = LocalHTTPServer("127.0.0.1", 0, wsgi, workers=workers)
        self.server.start()

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.server.host, self.server.port, timeout=120)

    def close(self) -> None:
        self.server.shutdown()
        self.store.close()


def throughput(served: Served, clients: int, per_client: int, label: str) -> float:
    def client(i: int) -> None:
        conn = served.connect()
        for event in signed_webhook_events(f"{label}-{i}", per_client):
            _request(conn, event)
            _request(conn, _get("/operations/" + json.loads(event["body"])["data"]["id"]))
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return clients * per_client * 2 / (time.perf_counter() - started)


def stalled_get_ms(served: Served, writers: int, hold_s: float, label: str) -> float:
    other = sqlite3.connect(served.db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    stop = threading.Event()

    def writer(i: int) -> None:
        conn = served.connect()
        for event in signed_webhook_events(f"{label}-w{i}", 50):
            if stop.is_set():
                break
            try:
                _request(conn, event)
            except OSError:  # the server closed the connection (shutdown): stop sending
                break
        conn.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    slowest = 0.0
    conn = served.connect()
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        started = time.perf_counter()
        _request(conn, _get("/operations/batches/none"))
        slowest = max(slowest, time.perf_counter() - started)
        time.sleep(0.05)
    other.execute("ROLLBACK")
    stop.set()
    for thread in threads:
        thread.join()
    conn.close()
    other.close()
    return slowest * 1000


def measure(
    worker_counts: tuple[int, ...] = (2, 4, 8, 16, 32),
    clients: int = 8,
    per_client: int = 100,
    writers: int = 8,
    hold_s: float = 1.5,
    rounds: int = 3,
) -> dict[str, Any]:
    logging.getLogger("waitress").setLevel(logging.ERROR)  # queue depth: what is measured here
    out: dict[str, Any] = {
        "clients": clients,
        "writers": writers,
        "hold_s": hold_s,
        "by_workers": {},
    }
    with tempfile.TemporaryDirectory(prefix="opstate-serve-bench-") as tmp, quiet_stdout():
        for workers in worker_counts:
            served = Served(Path(tmp), workers)
            try:
                rps = [
                    throughput(served, clients, per_client, f"t{workers}-{r}")
                    for r in range(rounds)
                ]
                stalled = stalled_get_ms(served, writers, hold_s, f"s{workers}")
            finally:
                served.close()
            out["by_workers"][str(workers)] = {
                "rps": round(statistics.median(rps), 1),
                "stalled_get_ms": round(stalled, 1),
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, nargs="*", default=[2, 4, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(measure(tuple(args.workers), rounds=args.rounds), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
