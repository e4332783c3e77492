"""Reconciler throughput: polled operations per second and store calls per polled operation.

Setup (the issue's measurement): 1000 open batch operations tracked in the store, the fake
Gemini server (``tests/support/fake_gemini.py``) adding ``--delay`` (default 50 ms) to every
request, ``--workers`` (default 8) workers, the real google-genai client. Discovery is off
(``reconcile_max_pages=0``) so every request is a poll; the one webhook listing of the run is
part of the measured time.

- Throughput: polled / wall time of ``reconcile_once``, against the limit ``workers / delay``
  (8 / 0.05 s = 160/s). Target: >= 80 % of the limit.
- Store calls per polled operation when nothing changed (the API answers what the store holds):
  every store method call counted by a wrapper (entries read from the open index counted one
  each, although a page holds 100). Target: <= 2 (the index entry + the schedule write; an
  unchanged answer needs no read).
- The same with every answer changed (RUNNING -> SUCCEEDED), for contrast (read + write).

Run: ``.venv/bin/python benchmarks/reconcile_throughput.py [--ops 1000] [--delay 0.05]
[--workers 8] [--store memory|sqlite] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opstate.config import Settings  # noqa: E402
from opstate.domain.model import OpRecord  # noqa: E402
from opstate.domain.states import State  # noqa: E402
from opstate.domain.times import format_time, parse_time  # noqa: E402
from opstate.reconcile.genai_gateway import GenaiGateway, make_client  # noqa: E402
from opstate.reconcile.run import reconcile_once  # noqa: E402
from opstate.store import MemoryStore, PollingStore  # noqa: E402
from tests.support.fake_gemini import FakeGemini  # noqa: E402
from tests.support.stores import CountingStore  # noqa: E402

T0 = parse_time("2026-05-01T10:00:00Z")


def make_store(kind: str, tmp: Path) -> PollingStore:
    if kind == "sqlite":
        from opstate.store.sqlite import SQLiteStore

        return SQLiteStore(tmp / "bench.db")
    return MemoryStore()


def program(fake: FakeGemini, ops: int, changed: bool) -> None:
    for i, name in enumerate(op_names(ops)):
        if changed:
            fake.put_batch(name, "BATCH_STATE_SUCCEEDED", update_time="2026-05-01T12:00:00Z")
        else:
            fake.put_batch(name, "BATCH_STATE_RUNNING", update_time=format_time(op_time(i)))
    fake.put_webhook("w1", name="bench", state="enabled")


def op_names(ops: int) -> list[str]:
    return [f"batches/bench{i:05d}" for i in range(ops)]


def op_time(i: int) -> int:
    return T0 + i * 1_000_000


def serve(args: argparse.Namespace) -> int:
    """Child process: the fake server (so its CPU does not share the client's GIL)."""
    with FakeGemini(request_delay=args.delay) as fake:
        program(fake, args.ops, args.changed)
        print(fake.base_url, flush=True)
        sys.stdin.readline()  # until the parent closes our stdin
    return 0


def start_server(args: argparse.Namespace, changed: bool) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, __file__, "--serve", "--ops", str(args.ops)]
    command += ["--delay", str(args.delay)] + (["--changed"] if changed else [])
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    return child, child.stdout.readline().strip()


def scenario(args: argparse.Namespace, *, changed: bool, tmp: Path) -> dict[str, Any]:
    tmp.mkdir(parents=True, exist_ok=True)
    inner = make_store(args.store, tmp)
    for i, name in enumerate(op_names(args.ops)):
        t = op_time(i)
        inner.put_if_absent(OpRecord(name, State.RUNNING, t, 1, "report", {}, t, t))
    settings = Settings(
        gemini_api_key="bench",
        reconcile_workers=args.workers,
        reconcile_max_pages=0,
        reconcile_open_limit=max(args.ops, 1),
        reconcile_http_timeout_s=10.0,
        reconcile_max_rps=0,  # this measures the worker pool, not the rate limit
    )
    child, base_url = start_server(args, changed)
    try:
        os.environ["GOOGLE_GEMINI_BASE_URL"] = base_url
        client = make_client(settings)
        store = CountingStore(inner)
        try:
            started = time.perf_counter()
            result = reconcile_once(store, GenaiGateway(client), settings=settings)
            elapsed = time.perf_counter() - started
        finally:
            client.close()
            inner.close()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    limit = args.workers / args.delay if args.delay > 0 else float("inf")
    rate = result.polled / elapsed
    calls = sum(store.calls.values())
    return {
        "changed": changed,
        "store": args.store,
        "ops": args.ops,
        "workers": args.workers,
        "delay_s": args.delay,
        "elapsed_s": round(elapsed, 3),
        "polled": result.polled,
        "polled_per_s": round(rate, 1),
        "limit_per_s": round(limit, 1),
        "fraction_of_limit": round(rate / limit, 3) if limit != float("inf") else None,
        "store_calls": dict(store.calls),
        "store_calls_per_polled": round(calls / max(result.polled, 1), 3),
        "result": result.as_dict(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--changed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args)
    with tempfile.TemporaryDirectory() as tmp:
        scenario(args, changed=False, tmp=Path(tmp) / "warm-up")  # imports, model builds
        unchanged = scenario(args, changed=False, tmp=Path(tmp) / "a")
        changed = scenario(args, changed=True, tmp=Path(tmp) / "b")
    if args.json:
        print(json.dumps([unchanged, changed], indent=2))
        return 0
    for row in (unchanged, changed):
        label = "answers changed  " if row["changed"] else "nothing changed  "
        frac = row["fraction_of_limit"]
        print(
            f"{label} {row['polled']} polled in {row['elapsed_s']} s = {row['polled_per_s']}/s "
            f"(limit {row['limit_per_s']}/s, {frac:.0%} of it); store calls per polled "
            f"operation {row['store_calls_per_polled']} {row['store_calls']} [{row['store']}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
