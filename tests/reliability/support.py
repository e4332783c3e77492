"""Shared pieces of the reliability suite: true timelines, signed deliveries, senders that retry
as Gemini does, and the checks every run ends with."""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from opstate.domain.events import from_report, from_webhook
from opstate.domain.model import OpRecord
from opstate.domain.states import RANK, State
from opstate.domain.times import parse_time
from opstate.ingest import ingest
from opstate.local.apigw import LocalLambdaContext
from opstate.store.port import RetryableError, Store
from tests.support.webhooks import http_event, signed_headers

SECRET = "whsec_" + base64.b64encode(b"opstate-reliability-secret-32byt").decode()
BASE = datetime(2026, 6, 1, 8, 0, 0, tzinfo=UTC)
OFFSETS = (timedelta(0), timedelta(hours=9), timedelta(hours=-5), timedelta(hours=5, minutes=30))
WEBHOOK_TYPE = {
    State.SUCCEEDED: "batch.succeeded",
    State.FAILED: "batch.failed",
    State.CANCELLED: "batch.cancelled",
}


@dataclass(frozen=True)
class Delivery:
    """One delivery of one true event: a signed webhook (terminal) or a report (PUT)."""

    name: str
    state: State
    text: str  # RFC3339 on the wire, in any precision and offset
    ns: int

    @property
    def webhook(self) -> bool:
        return self.state in WEBHOOK_TYPE

    @property
    def key(self) -> tuple[int, int]:
        return (RANK[self.state], self.ns)

    def webhook_body(self) -> dict[str, Any]:
        return {
            "type": WEBHOOK_TYPE[self.state],
            "version": "v1",
            "timestamp": self.text,
            "data": {"id": self.name},
        }

    def report_body(self) -> dict[str, Any]:
        return {"state": str(self.state), "updateTime": self.text}


def render(instant: datetime, rng: random.Random) -> str:
    local = instant.astimezone(timezone(rng.choice(OFFSETS)))
    frac = f"{local.microsecond:06d}000"
    digits = rng.choice([d for d in (0, 3, 6, 9) if frac[d:].strip("0") == ""])
    text = local.strftime("%Y-%m-%dT%H:%M:%S") + ("." + frac[:digits] if digits else "")
    offset = local.strftime("%z")
    return text + ("Z" if offset == "+0000" else offset[:3] + ":" + offset[3:])


def timelines(n_ops: int, rng: random.Random, prefix: str = "rel") -> dict[str, list[Delivery]]:
    """True timelines: PENDING, 1-3 RUNNING refreshes, then (mostly) one terminal state;
    consecutive times 250 ms apart, rendered in mixed precision and offsets."""
    out: dict[str, list[Delivery]] = {}
    for i in range(n_ops):
        name = f"batches/{prefix}-{i:05d}"
        start = BASE + timedelta(seconds=rng.randrange(0, 86_400))
        states = [State.PENDING] + [State.RUNNING] * rng.randint(1, 3)
        if rng.random() < 0.8:
            states.append(rng.choice(list(WEBHOOK_TYPE)))
        events = []
        for step, state in enumerate(states):
            text = render(start + timedelta(milliseconds=250 * step), rng)
            events.append(Delivery(name, state, text, parse_time(text)))
        out[name] = events
    return out


def shuffled_deliveries(
    lines: Mapping[str, Sequence[Delivery]], rng: random.Random, max_copies: int = 3
) -> list[Delivery]:
    """Every event 1..max_copies times, all shuffled (at-least-once, unordered)."""
    out = [
        d for events in lines.values() for d in events for _ in range(rng.randint(1, max_copies))
    ]
    rng.shuffle(out)
    return out


# -- deliveries as HTTP requests ------------------------------------------------------------------


def live_headers(body: bytes) -> dict[str, str]:
    """Signed with ``SECRET`` as a live sender signs: a fresh id, the current time."""
    return signed_headers(body, secrets=(SECRET,), msg_id=None, timestamp=None)


def delivery_request(d: Delivery) -> tuple[str, str, str, dict[str, str]]:
    """(method, path, body, headers) of one delivery as an HTTP request."""
    if d.webhook:
        body = json.dumps(d.webhook_body())
        return "POST", "/gemini/webhook", body, live_headers(body.encode())
    body = json.dumps(d.report_body())
    return "PUT", f"/operations/{d.name}", body, {"content-type": "application/json"}


# -- senders -----------------------------------------------------------------------------------

Send = Callable[[Delivery], tuple[int, dict[str, Any]]]


def ingest_sender(store: Store) -> Send:
    """The handler's contract without the HTTP layer: 200 on a decision, 503 on RetryableError."""

    def send(d: Delivery) -> tuple[int, dict[str, Any]]:
        if d.webhook:
            event = from_webhook(d.webhook_body())
        else:
            event = from_report(d.name, d.report_body(), now_ns=time.time_ns())
        try:
            decision = ingest(store, event, base_delay_s=0.0005, max_delay_s=0.005)
        except RetryableError:
            return 503, {"error": "unavailable"}
        version = decision.record.version if decision.record else 0
        return 200, {
            "applied": decision.applied,
            "reason": str(decision.reason),
            "version": version,
        }

    return send


def app_sender(app: Any) -> Send:
    """Through the API app (``create_app(...).resolve``), as API Gateway would call it."""
    context = LocalLambdaContext()

    def send(d: Delivery) -> tuple[int, dict[str, Any]]:
        method, path, body, headers = delivery_request(d)
        # Operations routes carry the IAM authorizer's context, as API Gateway adds it.
        event = http_event(
            method, path, body=body.encode(), headers=headers, iam=path.startswith("/operations/")
        )
        result = app.resolve(event, context)
        raw = result.get("body") or "{}"
        if result.get("isBase64Encoded"):
            raw = base64.b64decode(raw).decode()
        return int(result["statusCode"]), json.loads(raw)

    return send


@dataclass
class SenderLog:
    acked: list[Delivery] = field(default_factory=list)
    never_acked: list[Delivery] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    retried_after_5xx: int = 0
    client_errors: list[tuple[Delivery, int, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def deliver_with_retries(
    send: Send, d: Delivery, log: SenderLog, *, max_sends: int = 40, backoff_s: float = 0.0005
) -> None:
    """Deliver as Gemini does: retry on a 5xx, bounded; a 2xx is an acknowledgement."""
    for attempt in range(max_sends):
        status, body = send(d)
        with log.lock:
            log.statuses[status] = log.statuses.get(status, 0) + 1
        if 200 <= status < 300:
            with log.lock:
                log.acked.append(d)
            return
        if status < 500:
            with log.lock:
                log.client_errors.append((d, status, body))
            return
        with log.lock:
            log.retried_after_5xx += 1
        time.sleep(backoff_s * (attempt + 1))
    with log.lock:
        log.never_acked.append(d)


def run_senders(
    send: Send, deliveries: Sequence[Delivery], threads: int = 8, **kwargs: Any
) -> SenderLog:
    log = SenderLog()
    lanes = [deliveries[i::threads] for i in range(threads)]

    def worker(lane: Sequence[Delivery]) -> None:
        for d in lane:
            deliver_with_retries(send, d, log, **kwargs)

    workers = [threading.Thread(target=worker, args=(lane,)) for lane in lanes]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers), "a sender thread did not finish"
    return log


# -- checks ----------------------------------------------------------------------------------


def wrong_finals(
    lines: Mapping[str, Sequence[Delivery]], final: Callable[[str], OpRecord | None]
) -> list[str]:
    """Names whose final record is not their timeline's last event."""
    wrong = []
    for name, events in lines.items():
        record, truth = final(name), events[-1]
        if record is None or (record.state, record.update_time_ns) != (truth.state, truth.ns):
            wrong.append(name)
    return wrong


def missing_acks(
    acked: Sequence[Delivery], final: Callable[[str], OpRecord | None]
) -> list[Delivery]:
    """Acknowledged deliveries that the final record is behind: acknowledged, then lost."""
    missing = []
    for d in acked:
        record = final(d.name)
        if record is None or d.key > record.order_key:
            missing.append(d)
    return missing
