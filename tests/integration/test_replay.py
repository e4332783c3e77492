"""Replaying quarantined deliveries: what verifies again and can be read now is ingested and
forgotten, the rest stays kept."""

from __future__ import annotations

import json

from opstate.domain.events import WEBHOOK_TYPES
from opstate.domain.model import Reason
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.quarantine import Delivery, MemoryQuarantine
from opstate.replay import replay
from opstate.signatures import StaticSecretsVerifier
from opstate.store import MemoryStore, StoreUnavailableError
from tests.support.webhooks import TEST_SECRET, signed_headers

NOW_NS = parse_time("2026-05-10T10:00:00Z")
# A replay verifies again, without the timestamp tolerance.
VERIFIER = StaticSecretsVerifier((TEST_SECRET,), tolerance_s=None)


def kept(body: bytes | dict[str, object], i: int = 0) -> Delivery:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Delivery.new(
        raw,
        webhook_id=f"msg_{i}",
        reason="invalid-name",
        message="m",
        received_ns=NOW_NS + i,
        proof=signed_headers(raw, msg_id=f"msg_{i}"),
    )


def hook(event_type: str, data_id: str, ts: str = "2026-05-10T09:00:00Z") -> dict[str, object]:
    return {"type": event_type, "timestamp": ts, "data": {"id": data_id}}


def test_replay_ingests_what_is_readable_now_and_keeps_the_rest() -> None:
    q, store = MemoryQuarantine(), MemoryStore()
    readable = kept(hook("video.generated", "op1"), 0)  # a bare video id: readable today
    broken = kept(b"{", 1)
    odd_name = kept(hook("batch.succeeded", "batches/a b"), 2)
    unsupported = kept(hook("batch.paused", "b1"), 3)
    for d in (readable, broken, odd_name, unsupported):
        q.put(d)

    dry = replay(q, store, verifier=VERIFIER, dry_run=True, clock_ns=lambda: NOW_NS)
    assert (dry.taken, dry.applied, dry.unreadable, dry.dropped) == (4, 1, 2, 1)
    assert store.all() == [] and len(q.all()) == 4

    result = replay(q, store, verifier=VERIFIER, clock_ns=lambda: NOW_NS)
    assert (result.taken, result.applied, result.dropped, result.unreadable) == (4, 1, 1, 2)
    assert [p[1] for p in result.problems] == ["malformed-json", "invalid-name"]
    record = store.get("models/-/operations/op1")
    assert record is not None and record.state is State.SUCCEEDED
    assert q.all() == [broken, odd_name]
    assert result.to_json()["problems"][0] == {
        "id": broken.id,
        "error": "malformed-json",
        "message": "the body is not valid JSON",
    }


def test_replaying_a_delivery_twice_is_harmless() -> None:
    q, store = MemoryQuarantine(), MemoryStore()
    q.put(kept(hook("batch.succeeded", "b1"), 0))
    q.put(kept(hook("batch.succeeded", "b1"), 1))  # Gemini's retry of the same event
    result = replay(q, store, verifier=VERIFIER, clock_ns=lambda: NOW_NS)
    assert [d.reason for d in result.decisions] == [
        Reason.CREATED,
        Reason.STALE_OR_EQUAL_UPDATE_TIME,
    ]
    assert q.all() == [] and "batch.succeeded" in WEBHOOK_TYPES


def test_a_store_fault_keeps_the_delivery_for_the_next_replay() -> None:
    class Down(MemoryStore):
        def get(self, name: str) -> None:
            raise StoreUnavailableError("throttled")

    q = MemoryQuarantine()
    d = kept(hook("batch.failed", "b2"))
    q.put(d)
    result = replay(q, Down(), verifier=VERIFIER, clock_ns=lambda: NOW_NS)
    assert (result.errors, result.applied) == (1, 0)
    assert q.all() == [d]
