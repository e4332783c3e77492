"""The reconciler at scale: 10,000 open operations over a simulated 24 h.

Setup (issue 13): ``--ops`` (10,000) open operations in the store (SQLite, or DynamoDB on a moto
server), created over the 12 h before the start (ages uniform), 80 % batches, 10 % Veo videos,
5 % interactions, 5 % file-search imports; each finishes at a random time in the simulated
24 h, except ``--missing`` (0.5 %) that Gemini no longer knows (404). The gateway is the
in-memory fake (``tests/support/gemini_memory.py``) answering by the fake clock, with 1 % 429s
(``Retry-After: 1``). The run is the production one (``reconcile_once``) on a fake clock, every
5 minutes for 24 h (288 runs), ``OPSTATE_RECONCILE_MAX_RPS`` 100, 8 workers, a 180 s Lambda budget
against the fake clock. No webhooks: only the reconciler finishes operations here.

The 50 ms Gemini latency is modelled, not slept (a real sleep would make the 24 h take hours):
``seconds_per_run`` = max(fake time the run spent waiting for the rate limit and Retry-After,
requests x 50 ms / workers) + the run's real wall time (store calls, CPU).

Figures (``measure`` returns them; ``benchmarks/run.py`` puts them in results.json):

- ``requests`` vs ``baseline_requests``: Gemini requests, against "poll every open operation
  every run until it is terminal" (computed for the same timeline); per operation-hour too, and
  ``reduction`` = baseline / ours (target >= 5).
- ``max_delay_runs`` and ``over_schedule``: runs from an operation finishing on the fake to its
  record turning terminal; ``over_schedule`` counts operations that took longer than
  ceil(their poll interval / 5 min) + 2 runs (target 0).
- ``starved``: open operations whose gap between two polls exceeded the longest interval
  (30 min) + 2 runs (target 0).
- ``store_calls_per_poll``: store port calls (reads, writes, schedule writes, plus one per 100
  index entries read, the page size) per Gemini request; on DynamoDB also ``dynamodb_calls``
  by API operation and ``scans`` (target 0).
- ``seconds_per_run``: mean and max, see above.

Run: ``.venv/bin/python benchmarks/reconcile_scale.py [--store sqlite|moto|memory] [--ops N]
[--hours H] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for entry in (str(ROOT / "layers" / "opstate"), str(ROOT)):
    if entry not in sys.path:
        sys.path.insert(0, entry)
for _key, _value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_NAMESPACE": "GeminiOpstateBench",
    "POWERTOOLS_LOG_LEVEL": "ERROR",
}.items():
    os.environ[_key] = _value

import logging  # noqa: E402

from opstate.config import Settings  # noqa: E402
from opstate.domain.model import OpEvent, OpRecord  # noqa: E402
from opstate.domain.states import State  # noqa: E402
from opstate.observability import logger, metrics  # noqa: E402
from opstate.reconcile.gateway import GatewayError  # noqa: E402
from opstate.reconcile.run import MarkDecision, RunDecision, reconcile_once  # noqa: E402
from opstate.reconcile.schedule import Schedule  # noqa: E402
from opstate.store import MemoryStore, PollingStore  # noqa: E402
from tests.support.clock import FakeClock  # noqa: E402
from tests.support.stores import CountingStore  # noqa: E402

S = 1_000_000_000
T0 = 1_780_000_000 * S
RUN_EVERY_S = 300
LATENCY_S = 0.05
BUDGET_S = 180.0


class SimGateway:
    """Answers by the fake clock: RUNNING until the operation's finish time, then SUCCEEDED."""

    def __init__(self, clock: FakeClock, ops: dict[str, tuple[int, int]], missing: set[str]):
        import threading

        self.clock = clock
        self.ops = ops  # name -> (created_ns, finish_ns)
        self.missing = missing
        self.random = random.Random(7)
        self.lock = threading.Lock()
        self.polls: dict[str, list[int]] = {}
        self.requests = 0
        self.rate_limited = 0

    def webhooks(self) -> list[Any]:
        return []

    def batch_pages(self, page_size: int) -> Iterator[list[Any]]:
        return iter(())

    def fetch(self, record: OpRecord) -> OpEvent:
        now = self.clock.now_ns()
        name = record.name
        with self.lock:
            self.requests += 1
            if self.random.random() < 0.01:
                self.rate_limited += 1
                raise GatewayError("429", status=429, transient=True, retry_after_s=1.0)
            self.polls.setdefault(name, []).append(now)
        if name in self.missing:
            raise GatewayError("404", status=404)
        created, finish = self.ops[name]
        if now >= finish:
            return OpEvent(name, State.SUCCEEDED, finish, "poll", {})
        return OpEvent(name, State.RUNNING, created, "poll", {})


def op_name(i: int, kind_roll: float) -> str:
    if kind_roll < 0.80:
        return f"batches/b{i:06d}"
    if kind_roll < 0.90:
        return f"models/veo-3.1-generate-preview/operations/v{i:06d}"
    if kind_roll < 0.95:
        return f"interactions/i{i:06d}"
    return f"fileSearchStores/s/operations/f{i:06d}"


@contextmanager
def open_store(kind: str, tmp: Path) -> Iterator[tuple[PollingStore, Counter[str] | None]]:
    if kind == "memory":
        yield MemoryStore(), None
    elif kind == "sqlite":
        from opstate.store.sqlite import SQLiteStore

        store = SQLiteStore(tmp / "scale.db")
        try:
            yield store, None
        finally:
            store.close()
    else:
        import boto3

        from opstate.store.dynamodb import DynamoDBStore
        from tests.support.motoserver import start_moto_server
        from tests.support.template import create_table_from_template

        server = start_moto_server()
        try:
            client = boto3.client("dynamodb", endpoint_url=server.endpoint, region_name="us-east-1")
            calls: Counter[str] = Counter()

            def count_call(model: Any, **_: Any) -> None:
                calls[model.name] += 1

            client.meta.events.register("before-call.dynamodb", count_call)
            table = f"scale-{uuid.uuid4().hex[:8]}"
            create_table_from_template(client, table)
            calls.clear()
            yield DynamoDBStore(table, client=client), calls
        finally:
            server.stop()


@dataclass
class Timeline:
    """The simulated operations: name -> (created_ns, finish_ns), and those Gemini lost."""

    hours: float
    runs: int
    end_ns: int
    ops: dict[str, tuple[int, int]]
    missing: set[str]


def make_timeline(ops: int, hours: float, seed: int) -> Timeline:
    rng = random.Random(seed)
    timeline: dict[str, tuple[int, int]] = {}
    missing: set[str] = set()
    for i in range(ops):
        name = op_name(i, rng.random())
        created = T0 - int(rng.uniform(0, 12 * 3600) * S)
        finish = T0 + int(rng.uniform(0, hours * 3600) * S)
        timeline[name] = (created, finish)
        if rng.random() < 0.005:
            missing.add(name)
    runs = int(hours * 3600 // RUN_EVERY_S)
    return Timeline(hours, runs, T0 + int(hours * 3600 * S), timeline, missing)


@dataclass
class Simulation:
    """What the runs did: the gateway's polls, the run each operation turned terminal in, the
    marks, each run's modelled seconds and the store (and DynamoDB API) calls."""

    gateway: SimGateway
    schedule: Schedule
    terminal_at_run: dict[str, int] = field(default_factory=dict)
    marks: Counter[str] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)
    wall_total: float = 0.0
    store_calls: dict[str, int] = field(default_factory=dict)
    api: Counter[str] | None = None
    current_run: int = 0

    def on_decision(self, decision: RunDecision) -> None:
        if isinstance(decision, MarkDecision):
            self.marks[str(decision.mark)] += 1
            return
        record = decision.record
        if decision.applied and record is not None and record.terminal:
            self.terminal_at_run[record.name] = self.current_run


SETTINGS = Settings(
    store_url="memory://",
    reconcile_workers=8,
    reconcile_max_pages=0,
    reconcile_max_rps=100.0,
    reconcile_open_limit=100_000,
)


def simulate(store_kind: str, timeline: Timeline) -> Simulation:
    """Every run of the reconciler over the timeline, on a fake clock."""
    clock = FakeClock(T0)
    sim = Simulation(SimGateway(clock, timeline.ops, timeline.missing), Schedule())
    with tempfile.TemporaryDirectory() as tmp, open_store(store_kind, Path(tmp)) as (inner, api):
        for name, (created, _) in timeline.ops.items():
            record = OpRecord(name, State.RUNNING, created, 1, "report", {}, created, created)
            inner.put_if_absent(record)
        if api is not None:
            api.clear()
        store = CountingStore(inner)
        for run in range(timeline.runs):
            sim.current_run = run
            one_run(store, clock, sim, T0 + run * RUN_EVERY_S * S)
        sim.store_calls = dict(store.calls)
        sim.api = api
    return sim


def one_run(store: CountingStore, clock: FakeClock, sim: Simulation, start_ns: int) -> None:
    """One production run starting at ``start_ns``; its modelled seconds join ``sim``."""
    clock.set(start_ns)
    before = sim.gateway.requests
    deadline = start_ns + int(BUDGET_S * S)
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the EMF metric lines
        reconcile_once(
            store,
            sim.gateway,
            settings=SETTINGS,
            remaining_ms=lambda: clock.remaining_ms(deadline),
            clock=clock,
            schedule=sim.schedule,
            on_decision=sim.on_decision,
        )
        metrics.clear_metrics()
    wall = time.perf_counter() - started
    sim.wall_total += wall
    waited = (clock.now_ns() - start_ns) / S
    floor = (sim.gateway.requests - before) * LATENCY_S / SETTINGS.reconcile_workers
    sim.seconds.append(max(waited, floor) + wall)


@dataclass
class Delays:
    """Delays against the schedule, and the poll-everything baseline on the same timeline."""

    over: int = 0
    max_delay: int = 0
    baseline: int = 0
    open_hours: float = 0.0
    unseen_at_end: int = 0


def delays(timeline: Timeline, sim: Simulation) -> Delays:
    run_starts = [T0 + r * RUN_EVERY_S * S for r in range(timeline.runs)]
    out = Delays()
    for name, (created, finish) in timeline.ops.items():
        if name in timeline.missing or finish >= timeline.end_ns:
            out.baseline += timeline.runs
            out.open_hours += timeline.hours
            continue
        first_after = next(r for r, t in enumerate([*run_starts, timeline.end_ns]) if t >= finish)
        out.baseline += first_after + 1
        out.open_hours += (finish - T0) / S / 3600
        allowed = allowed_runs(sim, name, created, finish)
        done = sim.terminal_at_run.get(name)
        if done is None:
            if first_after + allowed <= timeline.runs:  # it had its chance within the simulation
                out.over += 1
            else:
                out.unseen_at_end += 1
            continue
        waited_runs = done - first_after + 1
        out.max_delay = max(out.max_delay, waited_runs)
        if waited_runs > allowed:
            out.over += 1
    return out


def allowed_runs(sim: Simulation, name: str, created: int, finish: int) -> int:
    """Runs an operation may take to turn terminal: its poll interval in runs, plus 2."""
    polls_before = [t for t in sim.gateway.polls.get(name, []) if t < finish]
    last = polls_before[-1] if polls_before else T0
    record = OpRecord(name, State.RUNNING, created, 1, "x", {}, created)
    interval = sim.schedule.interval_s(record, last)
    return math.ceil(interval / RUN_EVERY_S) + 2


def starved(timeline: Timeline, sim: Simulation) -> int:
    """Operations whose gap between two polls exceeded the longest interval + 2 runs."""
    cap_ns = int((sim.schedule.max_interval_s + 2 * RUN_EVERY_S) * S)
    count = 0
    for name, (_, finish) in timeline.ops.items():
        times = sim.gateway.polls.get(name, [])
        lost = name in timeline.missing
        stop = min(finish, timeline.end_ns) if not lost else timeline.end_ns
        gaps = [b - a for a, b in zip([T0, *times], [*times, stop], strict=False)]
        if lost and sim.marks["lost"]:
            gaps = gaps[:-1]  # lost operations leave the polling set on purpose
        if gaps and max(gaps) > cap_ns + RUN_EVERY_S * S:
            count += 1
    return count


def measure(
    store_kind: str, ops: int = 10_000, hours: float = 24.0, seed: int = 1
) -> dict[str, Any]:
    logger.setLevel(logging.ERROR)
    timeline = make_timeline(ops, hours, seed)
    sim = simulate(store_kind, timeline)
    late = delays(timeline, sim)
    calls = dict(sim.store_calls)
    polls = sim.gateway.requests
    entries = calls.pop("iter_due_entries", 0)
    result: dict[str, Any] = {
        "store": store_kind,
        "ops": ops,
        "hours": hours,
        "runs": timeline.runs,
        "requests": polls,
        "rate_limited_429": sim.gateway.rate_limited,
        "baseline_requests": late.baseline,
        "operation_hours": round(late.open_hours, 1),
        "requests_per_op_hour": round(polls / late.open_hours, 3),
        "baseline_per_op_hour": round(late.baseline / late.open_hours, 3),
        "reduction": round(late.baseline / max(polls, 1), 2),
        "max_delay_runs": late.max_delay,
        "over_schedule": late.over,
        "finished_too_late_to_see": late.unseen_at_end,
        "starved": starved(timeline, sim),
        "lost": sim.marks["lost"],
        "overdue": sim.marks["overdue"],
        "store_calls": calls,
        "index_entries_read": entries,
        "store_calls_per_poll": round((sum(calls.values()) + entries / 100) / max(polls, 1), 3),
        "seconds_per_run_mean": round(sum(sim.seconds) / len(sim.seconds), 2),
        "seconds_per_run_max": round(max(sim.seconds), 2),
        "wall_s": round(sim.wall_total, 1),
    }
    if sim.api is not None:
        result["dynamodb_calls"] = dict(sim.api)
        result["dynamodb_calls_per_poll"] = round(sum(sim.api.values()) / max(polls, 1), 3)
        result["scans"] = sim.api.get("Scan", 0)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["memory", "sqlite", "moto"], default="sqlite")
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.store, args.ops, args.hours)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
