"""DynamoDB calls per ingested event, counted with botocore event hooks.

Run: ``.venv/bin/python benchmarks/store_calls.py [--rounds N] [--inprocess]``

Starts its own moto server on 127.0.0.1 (or uses moto's in-process ``mock_aws`` with
``--inprocess``), builds the table from ``template.yaml`` and measures, per event:

- a new operation (first event of a name),
- an advancing event (PENDING -> RUNNING -> SUCCEEDED),
- a duplicate or stale event (already applied, or older than the stored one),
- 8-way contention: 8 threads deliver 8 different, strictly newer events of ONE operation at the
  same moment (a barrier), repeated ``--rounds`` times; the average is over all 8 x rounds events.

Targets: <= 2, <= 2, <= 1 and <= 3 calls per event on average, and zero lost events (every
contention round ends at its newest event, with version == number of applied decisions).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "layers" / "opstate")]

for _key, _value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_SESSION_TOKEN": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}.items():
    os.environ[_key] = _value
os.environ.pop("AWS_PROFILE", None)

from opstate.events import OpEvent  # noqa: E402
from opstate.ingest import ingest  # noqa: E402
from opstate.states import State  # noqa: E402
from opstate.store import RetryableError  # noqa: E402
from opstate.store.dynamodb import DynamoDBStore  # noqa: E402
from opstate.times import parse_time  # noqa: E402
from tests.support.stores import dynamodb_client, unique_table  # noqa: E402
from tests.support.template import create_table_from_template  # noqa: E402

T0 = parse_time("2026-06-01T10:00:00Z")
WRITERS = 8


class Calls:
    """Thread-safe count of DynamoDB API calls made through one client."""

    def __init__(self, client: Any) -> None:
        self._lock = threading.Lock()
        self.by_op: Counter[str] = Counter()
        client.meta.events.register("before-call.dynamodb.*", self._hook)

    def _hook(self, model: Any, **_: Any) -> None:
        with self._lock:
            self.by_op[model.name] += 1

    def total(self) -> int:
        with self._lock:
            return sum(self.by_op.values())

    def reset(self) -> None:
        with self._lock:
            self.by_op.clear()


@contextmanager
def endpoint(inprocess: bool, atomic: bool = True) -> Iterator[str | None]:
    if inprocess:
        from moto import mock_aws
        from moto.dynamodb.models import DynamoDBBackend

        # moto checks a condition and writes without a lock; real DynamoDB is atomic per item.
        original = DynamoDBBackend.put_item
        lock = threading.Lock()

        def atomic_put_item(self: Any, *args: Any, **kwargs: Any) -> Any:
            with lock:
                return original(self, *args, **kwargs)

        DynamoDBBackend.put_item = atomic_put_item  # type: ignore[method-assign]
        try:
            with mock_aws():
                yield None
        finally:
            DynamoDBBackend.put_item = original  # type: ignore[method-assign]
        return
    from tests.support.motoserver import start_moto_server

    server = start_moto_server(atomic_dynamodb=atomic)
    try:
        yield server.endpoint
    finally:
        server.stop()


def per_event(calls: Calls, store: DynamoDBStore, events: list[OpEvent]) -> float:
    calls.reset()
    for event in events:
        ingest(store, event)
    return calls.total() / len(events)


def writer(
    store: DynamoDBStore,
    event: OpEvent,
    barrier: threading.Barrier,
    applied: list[int],
    retries: list[int],
    i: int,
) -> None:
    barrier.wait()
    while True:
        try:
            applied[i] = int(ingest(store, event).applied)
            return
        except RetryableError:
            retries[i] += 1  # a sender would retry later: so do we


def contention(calls: Calls, store: DynamoDBStore, rounds: int) -> tuple[float, int, int]:
    """Average calls per event with 8 writers on one operation; (avg, lost, retried)."""
    lost = 0
    retried = 0
    contended_calls = 0
    for r in range(rounds):
        name = f"batches/contended-{r}"
        ingest(store, OpEvent(name, State.PENDING, T0, "report", {}))
        base = calls.total()
        events = [
            OpEvent(name, State.RUNNING, T0 + 1 + i, "webhook", {"writer": i})
            for i in range(WRITERS)
        ]
        barrier = threading.Barrier(WRITERS)
        applied = [0] * WRITERS
        retries = [0] * WRITERS

        threads = [
            threading.Thread(target=writer, args=(store, events[i], barrier, applied, retries, i))
            for i in range(WRITERS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        contended_calls += calls.total() - base
        record = store.get(name)
        newest = events[-1]
        if (
            record is None
            or record.update_time_ns != newest.update_time_ns
            or record.version != 1 + sum(applied)
        ):
            lost += 1
            print(f"lost: {name} ended {record} after applied={applied}", file=sys.stderr)
        retried += sum(retries)
    return contended_calls / (rounds * WRITERS), lost, retried


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=20, help="contention rounds (8 events each)")
    parser.add_argument("--ops", type=int, default=50, help="operations for the simple cases")
    parser.add_argument("--inprocess", action="store_true", help="moto mock_aws, no server")
    parser.add_argument(
        "--non-atomic",
        action="store_true",
        help="plain moto server (its conditional writes race; shows why tests serialise them)",
    )
    args = parser.parse_args()

    with endpoint(args.inprocess, atomic=not args.non_atomic) as url:
        client = dynamodb_client(url)
        table = unique_table()
        create_table_from_template(client, table)
        store = DynamoDBStore(table, client=client)
        calls = Calls(client)
        names = [f"batches/bench-{i}" for i in range(args.ops)]

        new = per_event(calls, store, [OpEvent(n, State.PENDING, T0, "report", {}) for n in names])
        advancing = per_event(
            calls,
            store,
            [OpEvent(n, State.RUNNING, T0 + 10, "poll", {}) for n in names]
            + [OpEvent(n, State.SUCCEEDED, T0 + 20, "webhook", {}) for n in names],
        )
        stale = per_event(
            calls,
            store,
            [OpEvent(n, State.SUCCEEDED, T0 + 20, "webhook", {}) for n in names]  # duplicate
            + [OpEvent(n, State.RUNNING, T0 + 15, "poll", {}) for n in names],  # stale
        )
        contended, lost, retried = contention(calls, store, args.rounds)

    backend = "moto in-process" if args.inprocess else "moto server"
    if args.non_atomic and not args.inprocess:
        backend += ", non-atomic"
    rows = [
        ("new operation", new, 2.0),
        ("advancing event", advancing, 2.0),
        ("duplicate/stale event", stale, 1.0),
        (f"{WRITERS}-way contention (avg)", contended, 3.0),
    ]
    print(f"DynamoDB calls per event ({backend}; {args.ops} ops, {args.rounds} contention rounds)")
    ok = True
    for label, value, target in rows:
        verdict = "ok" if value <= target else "OVER TARGET"
        ok &= value <= target
        print(f"  {label:<28} {value:5.2f}   target <= {target:.0f}   {verdict}")
    print(f"  lost events: {lost} (target 0); retryable errors retried: {retried}")
    return 0 if ok and lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
