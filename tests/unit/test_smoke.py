"""A first end-to-end check of the domain: the seed's two time bugs and its regression story."""

from opstate.events import from_webhook
from opstate.ingest import ingest
from opstate.reducer import Reason
from opstate.states import State
from opstate.store import MemoryStore
from opstate.times import parse_time


def test_fractional_and_offset_times_compare_as_instants() -> None:
    assert parse_time("2026-01-01T00:00:00.5Z") > parse_time("2026-01-01T00:00:00Z")
    assert parse_time("2026-01-01T09:00:00+09:00") == parse_time("2026-01-01T00:00:00Z")


def test_stale_running_after_succeeded_is_dropped() -> None:
    store = MemoryStore()
    done = from_webhook(
        {"type": "batch.succeeded", "timestamp": "2026-01-01T00:00:05Z", "data": {"id": "b1"}}
    )
    assert ingest(store, done).reason is Reason.CREATED
    from opstate.events import from_batch_job

    stale = from_batch_job(
        {"name": "batches/b1", "state": "JOB_STATE_RUNNING", "updateTime": "2026-01-01T00:00:01Z"}
    )
    decision = ingest(store, stale)
    assert not decision.applied
    assert decision.reason is Reason.REGRESS_FROM_TERMINAL
    record = store.get("batches/b1")
    assert record is not None and record.state is State.SUCCEEDED and record.version == 1
