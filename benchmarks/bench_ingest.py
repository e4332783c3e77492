"""Sections 1 and 3: ingest throughput through the webhook handler against the bare store round
trips, and 8-way contention on one operation (section 2, calls per event, is bench_calls.py).

- Throughput: N signed ``batch.succeeded`` deliveries of N new operations through the API app
  (``create_app(...).resolve``: body size check, Standard Webhooks signature check, JSON parse,
  normalise, reduce, conditional write, decision log line and metric) against the bare round
  trips the same work needs on the same store: ``store.get`` (consistent read) +
  ``store.put_if_absent`` of a prebuilt record, for N other new names. Rounds alternate
  (bare, handler, bare, handler, ...) and each side's figure is its median round. The app's log
  lines and EMF metrics are written (to /dev/null): that work is part of the handler.
- Contention: 8 threads, one operation, one timeline of ``events`` events dealt round-robin in
  true order (so most events are still applicable when read and writers race); a sender retries a
  ``RetryableError`` (the 503 a webhook would get) after a short pause, bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from opstate.domain.events import Source
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.states import State, rank
from opstate.domain.times import format_time
from opstate.ingest import ingest, ingest_counted
from opstate.local.apigw import LocalLambdaContext
from opstate.store.port import RetryableError, Store
from tests.support.webhooks import http_event, signed_headers

SECRET = "whsec_YmVuY2htYXJrLXNlY3JldC1mb3Itb3BzdGF0ZS0zMmI="
T0_NS = 1_780_000_000 * 1_000_000_000  # 2026-05-28


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Send fd 1 to /dev/null (Powertools log lines and EMF blobs), keep the cost of writing."""
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


# -- API Gateway events (tests.support.webhooks) -------------------------------------------------


def signed_webhook_events(prefix: str, n: int) -> list[dict[str, Any]]:
    """``n`` signed ``batch.succeeded`` deliveries of ``n`` new operations (signed beforehand:
    signing is the sender's cost)."""
    now = int(time.time())
    events = []
    for i in range(n):
        body = json.dumps(
            {
                "type": "batch.succeeded",
                "version": "v1",
                "timestamp": format_time(T0_NS + i * 1_000_000),
                "data": {"id": f"batches/{prefix}-{i:06d}", "output_file_uri": "files/out"},
            }
        ).encode()
        headers = signed_headers(body, secrets=(SECRET,), msg_id=f"msg_{prefix}_{i}", timestamp=now)
        events.append(http_event("POST", "/gemini/webhook", body=body, headers=headers))
    return events


def make_app(store: Store) -> Any:
    from opstate.api import create_app
    from opstate.config import Settings
    from opstate.signatures import StaticSecretsVerifier

    settings = Settings(webhook_secrets=(SECRET,))
    return create_app(store=store, verifier=StaticSecretsVerifier([SECRET]), settings=settings)


# -- 1. throughput ------------------------------------------------------------------------------


def throughput(store: Store, label: str, n: int, rounds: int) -> dict[str, float | int]:
    app = make_app(store)
    context = LocalLambdaContext()
    handler_s: list[float] = []
    bare_s: list[float] = []
    # one unmeasured warm-up of each path
    for event in signed_webhook_events(f"{label}-warm", 5):
        with quiet_stdout():
            app.resolve(event, context)
    for r in range(rounds):
        records = [
            OpRecord(f"batches/{label}-bare{r}-{i:06d}", State.SUCCEEDED, T0_NS + i, 1, "webhook")
            for i in range(n)
        ]
        started = time.perf_counter()
        for record in records:
            store.get(record.name)
            outcome = store.put_if_absent(record)
            assert outcome.ok
        bare_s.append(time.perf_counter() - started)

        events = signed_webhook_events(f"{label}-hook{r}", n)
        with quiet_stdout():
            started = time.perf_counter()
            for event in events:
                result = app.resolve(event, context)
                if result["statusCode"] != 200:
                    raise RuntimeError(f"handler answered {result['statusCode']}: {result}")
            handler_s.append(time.perf_counter() - started)
    handler_eps = n / statistics.median(handler_s)
    bare_eps = n / statistics.median(bare_s)
    return {
        "handler_eps": round(handler_eps, 1),
        "bare_eps": round(bare_eps, 1),
        "ratio": round(handler_eps / bare_eps, 3),
        "events_per_round": n,
        "rounds": rounds,
    }


def breakdown(store: Store, label: str, n: int) -> dict[str, float]:
    """Microseconds per event of each stage of the handler, measured alone on the same store
    right after the whole handler: signature check, JSON parse + normalise, ingest (store round
    trips + reduce), decision log line + metric; ``router_and_rest`` is the handler's time per
    event minus those (the Powertools resolver, response building, the app's own code)."""
    from opstate.domain.events import from_webhook
    from opstate.observability import record_decision
    from opstate.signatures import StaticSecretsVerifier

    verifier = StaticSecretsVerifier([SECRET])
    requests = [
        (e["body"].encode(), {k.lower(): v for k, v in e["headers"].items()})
        for e in signed_webhook_events(f"{label}-parts", n)
    ]

    def timed(fn: Callable[[], object]) -> float:
        started = time.perf_counter()
        fn()
        return (time.perf_counter() - started) * 1e6 / n

    app, context = make_app(store), LocalLambdaContext()
    whole = signed_webhook_events(f"{label}-whole", n)

    def handle_all() -> None:
        for event in whole:
            app.resolve(event, context)

    with quiet_stdout():
        handler_us = timed(handle_all)

    def verify_all() -> None:
        for raw, headers in requests:
            verifier.verify(raw, headers)

    verify_us = timed(verify_all)
    events: list[OpEvent] = []
    parse_us = timed(lambda: events.extend(from_webhook(json.loads(raw)) for raw, _ in requests))
    decisions: list[Any] = []
    ingest_us = timed(lambda: decisions.extend(ingest(store, e) for e in events))

    def log_all() -> None:
        for decision in decisions:
            record_decision(decision, webhook_id="msg")

    with quiet_stdout():
        log_us = timed(log_all)
    parts = verify_us + parse_us + ingest_us + log_us
    return {
        "handler_us": round(handler_us, 1),
        "signature_us": round(verify_us, 1),
        "parse_normalise_us": round(parse_us, 1),
        "ingest_us": round(ingest_us, 1),
        "log_and_metric_us": round(log_us, 1),
        "router_and_rest_us": round(max(0.0, handler_us - parts), 1),
    }


def _event(name: str, state: State, ns: int) -> OpEvent:
    return OpEvent(name, state, ns, Source.REPORT, {})


# -- 3. contention -----------------------------------------------------------------------------


@dataclass
class _Tally:
    acked: list[OpEvent] = field(default_factory=list)
    never_acked: list[OpEvent] = field(default_factory=list)
    gave_up: int = 0
    unavailable: int = 0
    applied: int = 0
    conflicts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def contention(
    store: Store,
    label: str,
    events: int,
    total: Callable[[], int],
    threads: int = 8,
    max_sends: int = 50,
) -> dict[str, Any]:
    """``events`` events of one operation's timeline (PENDING, RUNNING refreshes, SUCCEEDED),
    dealt round-robin in true order to ``threads`` threads that start together."""
    from opstate.ingest import IngestContentionError

    name = f"batches/{label}-{uuid.uuid4().hex[:8]}"
    timeline = [_event(name, State.PENDING, T0_NS)]
    timeline += [_event(name, State.RUNNING, T0_NS + i * 1_000) for i in range(1, events - 1)]
    timeline.append(_event(name, State.SUCCEEDED, T0_NS + events * 1_000))
    lanes = [timeline[i::threads] for i in range(threads)]
    tally = _Tally()
    barrier = threading.Barrier(threads)

    def worker(lane: list[OpEvent]) -> None:
        barrier.wait()
        for event in lane:
            for attempt in range(max_sends):
                try:
                    done = ingest_counted(store, event)
                except IngestContentionError:
                    with tally.lock:
                        tally.gave_up += 1
                except RetryableError:
                    with tally.lock:
                        tally.unavailable += 1
                else:
                    with tally.lock:
                        tally.acked.append(event)
                        tally.applied += int(done.decision.applied)
                        tally.conflicts += done.conflicts
                    break
                time.sleep(0.001 * (attempt + 1))
            else:
                with tally.lock:
                    tally.never_acked.append(event)

    before = total()
    started = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(lane,)) for lane in lanes]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - started
    calls = total() - before
    final = store.get(name)
    assert final is not None
    # lost: never acknowledged, or acknowledged and the final record is behind it
    lost = len(tally.never_acked) + sum(
        1 for e in tally.acked if (rank(e.state), e.update_time_ns) > final.order_key
    )
    truth = timeline[-1]
    return {
        "events": events,
        "threads": threads,
        "lost": lost,
        "gave_up": tally.gave_up,
        "unavailable": tally.unavailable,
        "calls_per_event": round(calls / events, 3),
        "applied": tally.applied,
        "conflicts": tally.conflicts,
        "final_version": final.version,
        "final_right": (final.state, final.update_time_ns) == (truth.state, truth.update_time_ns),
        "version_equals_applied": final.version == tally.applied,
        "seconds": round(seconds, 3),
    }
