"""Section 5: the seed's algorithm and ours on the same adversarial workload.

The workload: true timelines (PENDING, one or more RUNNING refreshes, then usually one terminal
state), with server times rendered in mixed precision (0, 3, 6 or 9 fractional digits) and
mixed offsets (``Z``, ``+09:00``, ``-05:00``, ``+05:30``), each event delivered 1-3 times,
shuffled, dealt to 8 sender threads so that they work on the same few operations at once, and
with an injected pause between each read and its conditional write (where a concurrent writer
slips in). The seed acknowledges everything with 200; our senders retry a 503 (a
``RetryableError``) as Gemini does.

Measured for each: ``wrong`` = operations whose final (state, instant) is not the timeline's last
event; ``lost`` = acknowledged deliveries that the final record is behind (their (rank, instant)
is greater than the final record's): the information was acknowledged and is gone.
"""

from __future__ import annotations

import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: ``tests.support`` lives at the repo root
    sys.path.insert(0, str(ROOT))

from seed_port import STATE_RANK, SeedApp, SeedEvent  # noqa: E402

from opstate.domain.events import Source  # noqa: E402
from opstate.domain.model import OpEvent, OpRecord  # noqa: E402
from opstate.domain.states import State  # noqa: E402
from opstate.domain.times import parse_time  # noqa: E402
from opstate.ingest import ingest  # noqa: E402
from opstate.store.port import RetryableError, Store, WriteOutcome  # noqa: E402
from tests.support.stores import DelegatingStore  # noqa: E402

_BASE = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
_OFFSETS = [timedelta(0), timedelta(hours=9), timedelta(hours=-5), timedelta(hours=5, minutes=30)]
_TERMINALS = ("SUCCEEDED", "FAILED", "CANCELLED")


@dataclass(frozen=True)
class Delivery:
    name: str
    state: str
    text: str  # the RFC3339 text as a sender would put it on the wire
    ns: int  # the true instant


def render(instant: datetime, rng: random.Random, uniform: bool = False) -> str:
    """The instant as RFC3339 in a random precision that represents it exactly, random offset
    (``uniform``: always 9 digits and ``Z``, the one format the seed's text comparison gets
    right)."""
    if uniform:
        return instant.strftime("%Y-%m-%dT%H:%M:%S.") + f"{instant.microsecond:06d}000Z"
    offset = rng.choice(_OFFSETS)
    local = instant.astimezone(timezone(offset))
    frac_us = local.microsecond
    choices = [3, 6, 9] if frac_us % 1000 == 0 else [6, 9]
    if frac_us == 0:
        choices.append(0)
    digits = rng.choice(choices)
    body = local.strftime("%Y-%m-%dT%H:%M:%S")
    if digits:
        body += "." + f"{frac_us:06d}000"[:digits]
    suffix = "Z" if offset == timedelta(0) else local.strftime("%z")
    if suffix != "Z":
        suffix = suffix[:3] + ":" + suffix[3:]
    return body + suffix


def make_timelines(n_ops: int, rng: random.Random, hot: int = 0) -> dict[str, list[Delivery]]:
    """``n_ops`` true timelines; consecutive times are 0.5 s apart (whole and half seconds).
    The first ``hot`` operations are long (40 RUNNING refreshes) and uniformly formatted (so
    only contention can hurt them): every thread works on them at once."""
    timelines: dict[str, list[Delivery]] = {}
    for i in range(n_ops):
        name = f"batches/{'hot' if i < hot else 'seed'}-{i:05d}"
        start = _BASE + timedelta(seconds=rng.randrange(0, 3600))
        refreshes = 40 if i < hot else rng.randint(1, 4)
        states = ["PENDING"] + ["RUNNING"] * refreshes
        if rng.random() < 0.75:
            states.append(rng.choice(_TERMINALS))
        events = []
        for step, state in enumerate(states):
            instant = start + timedelta(milliseconds=500 * step)
            text = render(instant, rng, uniform=i < hot)
            events.append(Delivery(name, state, text, parse_time(text)))
        timelines[name] = events
    return timelines


Waves = list[list[list[Delivery]]]  # waves x threads x deliveries


def deal(timelines: dict[str, list[Delivery]], threads: int, rng: random.Random) -> Waves:
    """Duplicate every event 1-3 times and deal the shuffled deliveries of a few operations at a
    time round-robin to the threads, so they contend on the same operations (a hot operation is
    dealt alone: all threads on it at once). Each chunk is one wave: the threads start a wave
    together (a barrier), so they really do work on the same operations at the same time."""
    waves: Waves = []
    names = list(timelines)
    rng.shuffle(names)
    chunks: list[list[str]] = []
    pending: list[str] = []
    for name in names:
        if name.startswith("batches/hot-"):
            chunks.append([name])
        else:
            pending.append(name)
            if len(pending) == 4:
                chunks.append(pending)
                pending = []
    if pending:
        chunks.append(pending)
    for chunk in chunks:
        if chunk[0].startswith("batches/hot-"):
            # progress reports of a hot operation arrive once each, in order, eight at a time:
            # every thread reads the same version, then they race for the write
            events = timelines[chunk[0]]
            for start in range(0, len(events), threads):
                group = list(events[start : start + threads])
                rng.shuffle(group)
                waves.append([[d] for d in group] + [[] for _ in range(threads - len(group))])
            continue
        batch = [d for n in chunk for d in timelines[n] for _ in range(rng.randint(1, 3))]
        rng.shuffle(batch)
        lanes: list[list[Delivery]] = [[] for _ in range(threads)]
        for i, delivery in enumerate(batch):
            lanes[i % threads].append(delivery)
        waves.append(lanes)
    return waves


def _key(state: str, ns: int) -> tuple[int, int]:
    return (STATE_RANK.get(state, -1), ns)


@dataclass
class Outcome:
    wrong: int = 0
    lost: int = 0
    acked: int = 0
    retries: int = 0
    unapplied_acks: int = 0  # seed only: 200 after max-retry-exceeded
    side_effects: int = 0
    seconds: float = 0.0


def _score(
    timelines: dict[str, list[Delivery]],
    final: Callable[[str], tuple[str, int] | None],
    acked: Sequence[Delivery],
    outcome: Outcome,
) -> None:
    finals = {name: final(name) for name in timelines}
    for name, events in timelines.items():
        truth = events[-1]
        got = finals[name]
        if got is None or got != (truth.state, truth.ns):
            outcome.wrong += 1
    for d in acked:
        got = finals[d.name]
        if got is None or _key(d.state, d.ns) > _key(*got):
            outcome.lost += 1
    outcome.acked = len(acked)


def _run_threads(waves: Waves, send: Callable[[Delivery], bool]) -> list[Delivery]:
    acked: list[Delivery] = []
    lock = threading.Lock()
    n_threads = len(waves[0]) if waves else 1
    barrier = threading.Barrier(n_threads)

    def worker(index: int) -> None:
        mine: list[Delivery] = []
        for wave in waves:
            barrier.wait()
            mine.extend(d for d in wave[index] if send(d))
        with lock:
            acked.extend(mine)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return acked


def make_pause(rng_seed: int, probability: float, max_s: float) -> Callable[[], None]:
    local = threading.local()

    def pause() -> None:
        rng: random.Random | None = getattr(local, "rng", None)
        if rng is None:
            rng = random.Random(rng_seed + threading.get_ident())
            local.rng = rng
        if rng.random() < probability:
            time.sleep(rng.random() * max_s)
        else:
            time.sleep(0)  # always yield the GIL between read and write

    return pause


class PausingStore(DelegatingStore):
    """Our store with the same injected pause between a read and the conditional write."""

    def __init__(self, inner: Store, pause: Callable[[], None]) -> None:
        super().__init__(inner)
        self.pause = pause

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        self.pause()
        return self.inner.put_if_absent(record)

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        self.pause()
        return self.inner.replace_if_version(record, expected_version)


def run_seed(
    timelines: dict[str, list[Delivery]], waves: Waves, db: Path, pause: Callable[[], None]
) -> Outcome:
    app = SeedApp(str(db), before_write=pause)
    out = Outcome()
    unapplied = 0
    lock = threading.Lock()

    def send(d: Delivery) -> bool:
        nonlocal unapplied
        result = app.ingest(SeedEvent(d.name, d.state, d.text))
        if result.applied and result.next is not None:
            app.enqueue_side_effect(result.next)
        if result.reason == "max-retry-exceeded":
            with lock:
                unapplied += 1
        return True  # the seed answers 200 whatever happened

    started = time.perf_counter()
    acked = _run_threads(waves, send)
    out.seconds = time.perf_counter() - started

    def final(name: str) -> tuple[str, int] | None:
        rec = app.get(name)
        return None if rec is None else (rec.state, parse_time(rec.update_time))

    _score(timelines, final, acked, out)
    out.unapplied_acks = unapplied
    out.side_effects = len(app.side_effects)
    app.close()
    return out


def run_ours(
    timelines: dict[str, list[Delivery]],
    waves: Waves,
    store: Store,
    pause: Callable[[], None],
    max_sends: int = 50,
) -> Outcome:
    wrapped = PausingStore(store, pause)
    out = Outcome()
    lock = threading.Lock()
    retries = 0
    changes = 0

    def send(d: Delivery) -> bool:
        nonlocal retries, changes
        event = OpEvent(d.name, State(d.state), parse_time(d.text), Source.REPORT, {})
        for attempt in range(max_sends):
            try:
                decision = ingest(wrapped, event)
            except RetryableError:  # answered 503: the sender retries later
                with lock:
                    retries += 1
                time.sleep(0.001 * (attempt + 1))
                continue
            if decision.state_changed:
                with lock:
                    changes += 1
            return True
        return False  # never acknowledged

    started = time.perf_counter()
    acked = _run_threads(waves, send)
    out.seconds = time.perf_counter() - started

    def final(name: str) -> tuple[str, int] | None:
        rec = store.get(name)
        return None if rec is None else (str(rec.state), rec.update_time_ns)

    _score(timelines, final, acked, out)
    out.retries = retries
    out.side_effects = changes
    return out


def default_store_factory(path: Path) -> Store:
    try:
        from opstate.store.sqlite import SQLiteStore
    except ImportError:  # the stores engineer's module is not there yet
        from opstate.store import MemoryStore

        return MemoryStore()
    return SQLiteStore(str(path))


@dataclass
class SeedComparison:
    operations: int
    events: int
    deliveries: int
    seed: Outcome
    ours: Outcome
    ours_store: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "operations": self.operations,
            "events": self.events,
            "deliveries": self.deliveries,
            "threads": 8,
            "ours_store": self.ours_store,
            "seed_wrong": self.seed.wrong,
            "seed_lost": self.seed.lost,
            "seed_max_retry_acks": self.seed.unapplied_acks,
            "seed_side_effects": self.seed.side_effects,
            "seed_seconds": round(self.seed.seconds, 3),
            "ours_wrong": self.ours.wrong,
            "ours_lost": self.ours.lost,
            "ours_retried_503": self.ours.retries,
            "ours_state_changes": self.ours.side_effects,
            "ours_seconds": round(self.ours.seconds, 3),
        }


def compare(
    n_ops: int,
    seed: int = 20260501,
    threads: int = 8,
    store_factory: Callable[[Path], Store] = default_store_factory,
) -> SeedComparison:
    rng = random.Random(seed)
    timelines = make_timelines(n_ops, rng, hot=max(2, n_ops // 10))
    waves = deal(timelines, threads, rng)
    with tempfile.TemporaryDirectory(prefix="opstate-seed-") as tmp:
        seed_out = run_seed(timelines, waves, Path(tmp) / "seed.db", make_pause(seed, 1.0, 0.002))
        store = store_factory(Path(tmp) / "ours.db")
        try:
            ours_out = run_ours(timelines, waves, store, make_pause(seed, 1.0, 0.002))
        finally:
            store.close()
    return SeedComparison(
        operations=n_ops,
        events=sum(len(t) for t in timelines.values()),
        deliveries=sum(len(lane) for wave in waves for lane in wave),
        seed=seed_out,
        ours=ours_out,
        ours_store=type(store).__name__,
    )


if __name__ == "__main__":
    import json

    print(json.dumps(compare(100).as_dict(), indent=2))
