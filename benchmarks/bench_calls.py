"""Section 2: DynamoDB API calls per ingested event (also runs on its own).

The real API calls of a ``DynamoDBStore`` are counted with a botocore ``before-call`` hook on its
client, per event:

- ``new``: the first event of an operation (target <= 1: a PENDING event is a PutItem under
  ``attribute_not_exists``, no read first);
- ``advancing``: a newer, higher-ranked event (<= 1: one conditional UpdateItem,
  ``DynamoDBStore.apply_if_newer``);
- ``duplicate``: the same state and time again (<= 1: the one-call write misses and hands
  back the item; nothing else);
- ``stale``: an older, lower-ranked event (<= 1);
- ``contended``: 8 threads on ONE operation, its timeline (PENDING, RUNNING refreshes,
  SUCCEEDED) dealt round-robin in true order and started together, a ``RetryableError`` (the
  webhook's 503) retried by its sender (``bench_ingest.contention``, section 3's workload);
  average over all events including the retried sends (<= 3), with ``contended_lost`` events
  (never acknowledged, or acknowledged and then behind the final record; must be 0).

``run.py`` runs it on its moto server. On its own it starts one (moto's DynamoDB made atomic
per request, as real DynamoDB is per item: ``tests/support/moto_atomic.py``), or uses moto's
in-process ``mock_aws`` with ``--inprocess`` (its ``put_item`` and ``update_item`` wrapped in a
lock for the same reason), or the plain, non-atomic moto server with ``--non-atomic`` (its
conditional writes race, which shows why the tests serialise them), and prints the figures
against their targets:

    .venv/bin/python benchmarks/bench_calls.py [--ops 50] [--contended 200] [--inprocess]
        [--non-atomic] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _entry in (str(HERE), str(ROOT), str(ROOT / "layers" / "opstate")):
    if _entry not in sys.path:
        sys.path.insert(0, _entry)

import bench_ingest  # noqa: E402

from opstate.domain.events import Source  # noqa: E402
from opstate.domain.model import OpEvent  # noqa: E402
from opstate.domain.states import State  # noqa: E402
from opstate.ingest import ingest  # noqa: E402
from opstate.store.port import Store  # noqa: E402

TARGETS = {"new": 1.0, "advancing": 1.0, "duplicate": 1.0, "stale": 1.0, "contended": 3.0}


class ApiCallCounter:
    """Counts DynamoDB API calls made by a boto3 client (botocore ``before-call`` events)."""

    def __init__(self, client: Any) -> None:
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        client.meta.events.register("before-call.dynamodb", self._on_call)

    def _on_call(self, model: Any = None, **_: Any) -> None:
        with self._lock:
            self.calls[getattr(model, "name", "?")] += 1

    def total(self) -> int:
        with self._lock:
            return sum(self.calls.values())


def _event(name: str, state: State, ns: int) -> OpEvent:
    return OpEvent(name, state, ns, Source.REPORT, {})


def calls_per_event(
    store: Store, label: str, n: int, total: Callable[[], int], contended_events: int
) -> dict[str, float | int]:
    """Calls per event of each case, ``n`` operations each (``contended_events`` events of one
    operation for ``contended``); ``total`` reads the running count of calls."""
    t0 = bench_ingest.T0_NS
    names = [f"batches/{label}-calls-{i:05d}" for i in range(n)]

    def per_event(events: Sequence[OpEvent]) -> float:
        before = total()
        for event in events:
            ingest(store, event)
        return (total() - before) / len(events)

    new = per_event([_event(name, State.PENDING, t0) for name in names])
    advancing = per_event([_event(name, State.RUNNING, t0 + 1_000) for name in names])
    duplicate = per_event([_event(name, State.RUNNING, t0 + 1_000) for name in names])
    stale = per_event([_event(name, State.PENDING, t0 + 5) for name in names])
    result = bench_ingest.contention(store, f"{label}-calls-hot", contended_events, total)
    return {
        "new": round(new, 3),
        "advancing": round(advancing, 3),
        "duplicate": round(duplicate, 3),
        "stale": round(stale, 3),
        "contended": float(result["calls_per_event"]),
        "contended_lost": int(result["lost"]),
    }


# -- index writes per job --------------------------------------------------------------------------

# The GSIs of the operations table and their keys (template.yaml; projection ALL each): an item
# is in an index while it has both keys.
INDEX_KEYS = {
    "open-index": ("open_shard", "open_update_ns"),
    "archive-index": ("archive_queue", "archive_due_ns"),
    "retry-index": ("retry_queue", "retry_due_ns"),
}


def index_writes(before: dict[str, Any] | None, after: dict[str, Any] | None) -> Counter[str]:
    """The index writes one table write makes, by index (DynamoDB's rules for a GSI): an item
    entering or leaving an index is one; one whose index key changes is two (a delete and a
    put); one that stays with its keys and changes any attribute is one (projection ALL)."""
    out: Counter[str] = Counter()
    for index, keys in INDEX_KEYS.items():
        was = before is not None and all(k in before for k in keys)
        now = after is not None and all(k in after for k in keys)
        if was and now:
            assert before is not None and after is not None
            if any(before[k] != after[k] for k in keys):
                out[index] += 2
            elif before != after:
                out[index] += 1
        elif was or now:
            out[index] += 1
    return out


def index_writes_per_job(
    store: Any, raw: Callable[[str], dict[str, Any] | None], label: str, polls: int = 6
) -> dict[str, Any]:
    """Index writes of one tracked batch's life on the store, step by step: tracked (PENDING),
    seen RUNNING by a poll, ``polls`` reschedules, SUCCEEDED by its webhook, its archive
    claimed and settled, then refreshed once more (a later listing or poll with a newer time).
    ``raw(name)`` reads the stored item (uncounted)."""
    from opstate.store.port import ArchiveState

    name = f"batches/{label}-index"
    t0 = bench_ingest.T0_NS
    steps: dict[str, Counter[str]] = {}

    def step(what: str, write: Callable[[], object]) -> None:
        before = raw(name)
        write()
        steps[what] = steps.get(what, Counter()) + index_writes(before, raw(name))

    step("tracked", lambda: ingest(store, _event(name, State.PENDING, t0)))
    step("running", lambda: ingest(store, _event(name, State.RUNNING, t0 + 1)))
    for i in range(polls):
        record = store.get(name)
        poll = store.poll_state(name)
        due = replace(poll, due_ns=t0 + (i + 1) * 300 * 10**9)
        step("polls", partial(store.set_poll, name, record.version, due))
    step("succeeded", lambda: ingest(store, OpEvent(name, State.SUCCEEDED, t0 + 9, "webhook", {})))
    created = store.get(name).created_ns
    claim = ArchiveState("pending", created_ns=created, due_ns=t0 + 10**12)
    step("archive claimed", lambda: store.set_archive(name, 0, claim))
    done = ArchiveState("archived", created_ns=created, archived_ns=t0 + 10**12)
    step("archive settled", lambda: store.set_archive(name, 1, done))
    step(
        "refreshed",
        lambda: ingest(store, OpEvent(name, State.SUCCEEDED, t0 + 99, "poll", {})),
    )
    total: Counter[str] = sum(steps.values(), Counter())
    return {
        "total": sum(total.values()),
        "by_index": dict(total),
        "by_step": {k: sum(v.values()) for k, v in steps.items()},
    }


# -- standalone ----------------------------------------------------------------------------------


@contextmanager
def _endpoint(inprocess: bool, atomic: bool) -> Iterator[str | None]:
    if inprocess:
        from moto import mock_aws
        from moto.dynamodb.models import DynamoDBBackend

        # moto checks a condition and writes without a lock; real DynamoDB is atomic per item.
        originals = {op: getattr(DynamoDBBackend, op) for op in ("put_item", "update_item")}
        lock = threading.Lock()

        def locked(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                with lock:
                    return original(self, *args, **kwargs)

            return call

        for op, original in originals.items():
            setattr(DynamoDBBackend, op, locked(original))
        try:
            with mock_aws():
                yield None
        finally:
            for op, original in originals.items():
                setattr(DynamoDBBackend, op, original)
        return
    from tests.support.motoserver import start_moto_server

    server = start_moto_server(atomic_dynamodb=atomic)
    try:
        yield server.endpoint
    finally:
        server.stop()


def _raw(client: Any, table: str) -> Callable[[str], dict[str, Any] | None]:
    def raw(name: str) -> dict[str, Any] | None:
        found = client.get_item(TableName=table, Key={"name": {"S": name}}, ConsistentRead=True)
        item: dict[str, Any] | None = found.get("Item")
        return item

    return raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ops", type=int, default=50, help="operations per simple case")
    parser.add_argument("--contended", type=int, default=200, help="events of the contended case")
    parser.add_argument("--inprocess", action="store_true", help="moto mock_aws, no server")
    parser.add_argument("--non-atomic", action="store_true", help="plain moto server")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        os.environ[key] = "bench"
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    os.environ.pop("AWS_PROFILE", None)

    from opstate.store.dynamodb import DynamoDBStore
    from tests.support.stores import dynamodb_client, unique_table
    from tests.support.template import create_table_from_template

    with _endpoint(args.inprocess, atomic=not args.non_atomic) as url:
        client = dynamodb_client(url)
        table = unique_table()
        create_table_from_template(client, table)
        counter = ApiCallCounter(client)
        store = DynamoDBStore(table, client=client)
        result = calls_per_event(store, "calls", args.ops, counter.total, args.contended)
        indexes = index_writes_per_job(store, _raw(client, table), "calls")

    backend = "moto in-process" if args.inprocess else "moto server"
    if args.non_atomic and not args.inprocess:
        backend += ", non-atomic"
    ok = result["contended_lost"] == 0 and all(result[k] <= v for k, v in TARGETS.items())
    if args.json:
        print(json.dumps({**result, "index_writes": indexes, "store": backend}, indent=2))
        return 0 if ok else 1
    print(f"DynamoDB calls per event ({backend}; {args.ops} ops, {args.contended} contended)")
    for key, target in TARGETS.items():
        verdict = "ok" if result[key] <= target else "OVER TARGET"
        print(f"  {key:<12} {result[key]:6.3f}   target <= {target:.0f}   {verdict}")
    print(f"  contended events lost: {result['contended_lost']} (target 0)")
    print(f"index writes per job: {indexes['total']}  by index {indexes['by_index']}")
    print(f"  by step {indexes['by_step']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
