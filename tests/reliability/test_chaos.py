"""Chaos: a real store that throttles, times out and loses the responses of writes that landed.

Senders retry 5xx as Gemini does. At the end every final record is its timeline's last event, no
acknowledged event is missing, and every record's version equals the number of its writes that
really landed. A retry of a write whose response was lost is answered 200 (stale/equal).
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from opstate.domain.model import Reason
from opstate.domain.states import State
from opstate.store import MemoryStore
from opstate.store.port import Store
from opstate.store.sqlite import SQLiteStore
from tests.reliability.support import (
    SECRET,
    Delivery,
    Send,
    app_sender,
    ingest_sender,
    missing_acks,
    run_senders,
    shuffled_deliveries,
    timelines,
    wrong_finals,
)
from tests.support.chaos import LOST_RESPONSE, THROTTLE, TIMEOUT, ChaosRates, ChaosStore

HAVE_API = importlib.util.find_spec("opstate.api") is not None


def make_app_sender(store: Store) -> Send:
    from opstate.api import create_app
    from opstate.config import Settings
    from opstate.signatures import StaticSecretsVerifier

    settings = Settings(webhook_secrets=(SECRET,))
    app = create_app(store=store, verifier=StaticSecretsVerifier([SECRET]), settings=settings)
    return app_sender(app)


PATHS = [
    pytest.param("ingest", id="through-ingest"),
    pytest.param(
        "app",
        id="through-api-app",
        marks=pytest.mark.skipif(not HAVE_API, reason="opstate.api is not built yet"),
    ),
]


def sender_for(path: str, store: Store) -> Send:
    return make_app_sender(store) if path == "app" else ingest_sender(store)


def sqlite_store(tmp_path: Path) -> SQLiteStore:
    return SQLiteStore(tmp_path / "chaos.db")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", PATHS)
def test_chaos_run_loses_nothing_and_versions_match_landed_writes(
    path: str, tmp_path: Path
) -> None:
    rng = random.Random(9)
    lines = timelines(200, rng, prefix=f"chaos-{path}")
    deliveries = shuffled_deliveries(lines, rng)
    inner = sqlite_store(tmp_path)
    chaos = ChaosStore(inner, ChaosRates(throttle=0.1, timeout=0.05, lost_response=0.15), seed=3)
    try:
        log = run_senders(sender_for(path, chaos), deliveries, threads=8, max_sends=60)

        assert log.client_errors == []
        assert log.never_acked == [], "a delivery was refused (5xx) on every retry"
        assert len(log.acked) == len(deliveries)
        # the faults really happened, including writes whose response was lost
        assert chaos.faults[THROTTLE] > 0
        assert chaos.faults[TIMEOUT] > 0
        assert chaos.faults[LOST_RESPONSE] > 0
        assert log.retried_after_5xx >= chaos.faults[LOST_RESPONSE]

        assert wrong_finals(lines, inner.get) == []
        assert missing_acks(log.acked, inner.get) == []
        for name in lines:
            record = inner.get(name)
            assert record is not None
            assert record.version == chaos.landed[name], name
    finally:
        chaos.close()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("first_state", [State.PENDING, State.SUCCEEDED])
def test_retry_after_lost_response_is_answered_200_stale(
    path: str, first_state: State, tmp_path: Path
) -> None:
    """The write lands, the response is lost: 503; the sender's retry: 200 stale-or-equal."""
    name = f"batches/lost-{path}-{first_state.value.lower()}"
    text = "2026-06-01T08:00:00.5+09:00"
    from opstate.domain.times import parse_time

    d = Delivery(name, first_state, text, parse_time(text))
    inner = sqlite_store(tmp_path)
    chaos = ChaosStore(inner, ChaosRates(0, 0, 0))
    send = sender_for(path, chaos)

    chaos.force(LOST_RESPONSE)
    status, _ = send(d)
    assert status == 503
    stored = inner.get(name)
    assert stored is not None and stored.version == 1  # the write went through

    status, body = send(d)
    assert status == 200
    assert body["applied"] is False
    assert body["reason"] == Reason.STALE_OR_EQUAL_UPDATE_TIME
    assert body["version"] == 1
    after = inner.get(name)
    assert after == stored
    assert chaos.landed[name] == 1


@pytest.mark.parametrize("path", PATHS)
def test_lost_response_on_an_advancing_write_then_retry(path: str) -> None:
    """Same on an existing record: the advance lands with its response lost, the retry is 200."""
    from opstate.domain.times import parse_time

    name = f"batches/advance-{path}"
    pending = Delivery(
        name, State.PENDING, "2026-06-01T08:00:00Z", parse_time("2026-06-01T08:00:00Z")
    )
    done_text = "2026-06-01T08:00:00.250Z"
    done = Delivery(name, State.SUCCEEDED, done_text, parse_time(done_text))
    inner = MemoryStore()
    chaos = ChaosStore(inner, ChaosRates(0, 0, 0))
    send = sender_for(path, chaos)
    assert send(pending)[0] == 200
    chaos.force(LOST_RESPONSE, TIMEOUT)
    assert send(done)[0] == 503  # landed, response lost
    assert send(done)[0] == 200  # the retry: nothing to write, so the forced timeout is not hit
    record = inner.get(name)
    assert record is not None
    assert (record.state, record.version) == (State.SUCCEEDED, 2)
    assert chaos.landed[name] == 2


def test_chaos_store_faults_behave_as_documented() -> None:
    """The wrapper itself: throttle and timeout write nothing, a lost response writes."""
    from opstate.domain.model import OpRecord

    inner = MemoryStore()
    chaos = ChaosStore(inner, ChaosRates(0, 0, 0))
    record = OpRecord("batches/x", State.PENDING, 1, 1, "report")
    from opstate.store.port import StoreUnavailableError

    for kind in (THROTTLE, TIMEOUT):
        chaos.force(kind)
        with pytest.raises(StoreUnavailableError):
            chaos.put_if_absent(record)
        assert inner.get("batches/x") is None
    chaos.force(LOST_RESPONSE)
    with pytest.raises(StoreUnavailableError):
        chaos.put_if_absent(record)
    assert inner.get("batches/x") == record
    assert chaos.landed["batches/x"] == 1
    assert chaos.put_if_absent(record).ok is False  # no fault left: the condition fails
    with pytest.raises(ValueError):
        ChaosRates(0.5, 0.3, 0.3)
    with pytest.raises(ValueError):
        chaos.force("gremlins")
