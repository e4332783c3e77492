"""Many writers, shuffled and duplicated deliveries: the stored record ends at the true last event.

8 threads share 200 operations (60 on the moto server, where each write is an HTTP round trip);
each operation's true timeline is delivered 3 times, shuffled across the threads, against the
moto server and against SQLite (and 3 processes on one SQLite file). A writer that gets a
``RetryableError`` re-queues the delivery, as a webhook sender would; any other exception fails
the test.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from opstate.domain.model import OpEvent
from opstate.domain.states import State, is_terminal
from opstate.domain.times import parse_time
from opstate.ingest import ingest
from opstate.store import RetryableError, Store
from opstate.store.sqlite import SQLiteStore
from tests.support.stores import dynamodb_client, dynamodb_harness

T0 = parse_time("2026-06-01T10:00:00Z")
THREADS = 8
OPERATIONS = 200
# Fewer on the moto server: each delivery there costs a server round trip (200 took 17 s), and
# with 8 threads on 60 operations as many deliveries race on one record; a create without its
# condition (put_if_absent as a plain PutItem) still fails here.
SERVER_OPERATIONS = 60
COPIES = 3
MAX_REDELIVERIES = 50


def make_timelines(seed: int, count: int, prefix: str) -> dict[str, list[OpEvent]]:
    """Per operation, a true timeline: ranks non-decreasing, strictly newer times, at most one
    terminal state and only at the end; 1 to 4 events."""
    rng = random.Random(seed)
    timelines: dict[str, list[OpEvent]] = {}
    for i in range(count):
        name = f"batches/{prefix}-{i:03d}"
        path = [
            State.PENDING,
            State.RUNNING,
            rng.choice([State.RUNNING, State.REQUIRES_ACTION]),
            rng.choice([State.SUCCEEDED, State.FAILED, State.CANCELLED]),
        ]
        picks = sorted(rng.sample(range(len(path)), rng.randint(1, len(path))))
        t = T0 + rng.randint(0, 10**9)
        events = []
        for step in picks:
            t += rng.randint(1, 10**9)
            details = {"step": step, f"seen{step}": True}
            events.append(OpEvent(name, path[step], t, "webhook", details))
        timelines[name] = events
    return timelines


def deal(timelines: dict[str, list[OpEvent]], hands: int, seed: int) -> list[list[OpEvent]]:
    deliveries = [e for events in timelines.values() for e in events] * COPIES
    random.Random(seed).shuffle(deliveries)
    return [deliveries[i::hands] for i in range(hands)]


def key(event: OpEvent) -> tuple[str, State, int]:
    return (event.name, event.state, event.update_time_ns)


@dataclass
class Outcome:
    applied: list[OpEvent]
    retried: int
    unexpected: list[BaseException]


def deliver(store: Store, queue: list[OpEvent]) -> Outcome:
    """Ingest every delivery; a retryable error puts it back at the end of the queue."""
    applied: list[OpEvent] = []
    retried = 0
    unexpected: list[BaseException] = []
    attempts: Counter[tuple[str, State, int]] = Counter()
    pending = list(queue)
    while pending:
        event = pending.pop(0)
        try:
            decision = ingest(store, event)
        except RetryableError:
            attempts[key(event)] += 1
            retried += 1
            if attempts[key(event)] > MAX_REDELIVERIES:
                unexpected.append(RuntimeError(f"gave up redelivering {event}"))
            else:
                pending.append(event)
            continue
        except BaseException as exc:
            unexpected.append(exc)
            continue
        if decision.applied:
            applied.append(event)
    return Outcome(applied, retried, unexpected)


def run_threads(store: Store, hands: list[list[OpEvent]]) -> list[Outcome]:
    outcomes: list[Outcome | None] = [None] * len(hands)

    def work(i: int) -> None:
        outcomes[i] = deliver(store, hands[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(hands))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(not t.is_alive() for t in threads)
    assert all(o is not None for o in outcomes)
    return [o for o in outcomes if o is not None]


def check(
    store: Store, timelines: dict[str, list[OpEvent]], outcomes: list[Outcome]
) -> dict[str, Any]:
    unexpected = [e for o in outcomes for e in o.unexpected]
    assert unexpected == [], f"non-retryable errors escaped ingest: {unexpected[:3]}"
    applied: dict[str, list[OpEvent]] = defaultdict(list)
    for outcome in outcomes:
        for event in outcome.applied:
            applied[event.name].append(event)
    for name, events in timelines.items():
        record = store.get(name)
        last = events[-1]
        assert record is not None, name
        assert (record.state, record.update_time_ns) == (last.state, last.update_time_ns), name
        assert record.source == last.source
        assert {k: record.details.get(k) for k in last.details} == dict(last.details)
        # version counts applied decisions; no event of the timeline was applied twice
        assert record.version == len(applied[name]), name
        keys = [key(e) for e in applied[name]]
        assert len(set(keys)) == len(keys), name
        assert set(keys) <= {key(e) for e in events}
        assert key(last) in keys
    open_names = {r.name for r in store.list_open(10_000)}
    assert open_names == {n for n, events in timelines.items() if not is_terminal(events[-1].state)}
    return {
        "applied": sum(len(v) for v in applied.values()),
        "retried": sum(o.retried for o in outcomes),
    }


@pytest.fixture
def server_store(moto_server: Any) -> Iterator[Store]:
    client = dynamodb_client(moto_server.endpoint)
    harness = dynamodb_harness(client, kind="dynamodb-server")
    try:
        yield harness.store
    finally:
        client.delete_table(TableName=harness.table)
        harness.store.close()


def test_eight_threads_on_the_moto_server(server_store: Store) -> None:
    timelines = make_timelines(1, SERVER_OPERATIONS, "moto")
    outcomes = run_threads(server_store, deal(timelines, THREADS, 11))
    stats = check(server_store, timelines, outcomes)
    assert stats["applied"] >= SERVER_OPERATIONS


def test_eight_threads_on_sqlite(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ops.db")
    try:
        timelines = make_timelines(2, OPERATIONS, "sqlite")
        outcomes = run_threads(store, deal(timelines, THREADS, 12))
        stats = check(store, timelines, outcomes)
        assert stats["applied"] >= OPERATIONS
    finally:
        store.close()


def _process_worker(path: str, queue: list[OpEvent]) -> tuple[list[OpEvent], int, list[str]]:
    store = SQLiteStore(path)
    try:
        outcome = deliver(store, queue)
    finally:
        store.close()
    return outcome.applied, outcome.retried, [repr(e) for e in outcome.unexpected]


def test_three_processes_on_one_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    timelines = make_timelines(3, 60, "proc")
    hands = deal(timelines, 3, 13)
    context = multiprocessing.get_context("spawn")
    with context.Pool(3) as pool:
        results = pool.starmap(_process_worker, [(str(path), hand) for hand in hands])
    outcomes = [
        Outcome(applied, retried, [RuntimeError(e) for e in errors])
        for applied, retried, errors in results
    ]
    store = SQLiteStore(path)
    try:
        stats = check(store, timelines, outcomes)
        assert stats["applied"] >= 60
    finally:
        store.close()
