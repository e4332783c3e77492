"""The reconciler's re-drive of due archives: invoked only with a due archive, an archiver to
invoke and time left; a fault never escapes."""

from __future__ import annotations

import json

from opstate.config import Settings
from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.outcomes.redrive import redrive
from opstate.store import MemoryStore
from opstate.store.port import ArchiveState
from opstate.store.retry_state import RETRY_ACTIVE, RetryState

T = 1_780_000_000 * 10**9
CONFIGURED = Settings(archiver_function="arn:aws:lambda:us-east-1:1:function:archiver")


def test_redrive_invokes_the_archiver_only_when_an_archive_is_due() -> None:
    calls: list[tuple[str, bytes]] = []
    store = MemoryStore()
    ingest(store, OpEvent("batches/open", State.RUNNING, T, "poll", {}), clock_ns=lambda: T)
    assert not redrive(store, CONFIGURED, invoke=lambda f, p: calls.append((f, p)))
    ingest(store, OpEvent("batches/done", State.SUCCEEDED, T, "poll", {}), clock_ns=lambda: T)
    assert not redrive(store, Settings(), invoke=lambda f, p: calls.append((f, p)))  # no archiver
    assert not redrive(  # no time left in the run's budget
        store, CONFIGURED, remaining_s=lambda: 1.0, invoke=lambda f, p: calls.append((f, p))
    )
    assert calls == []
    assert redrive(store, CONFIGURED, invoke=lambda f, p: calls.append((f, p)), clock_ns=lambda: T)
    ((function, payload),) = calls
    assert function == CONFIGURED.archiver_function
    assert json.loads(payload)["first"] == "batches/done"
    # Settled: nothing more to re-drive.
    record = store.get("batches/done")
    assert record is not None
    assert store.set_archive(
        "batches/done", 0, ArchiveState("archived", created_ns=record.created_ns)
    )
    assert not redrive(store, CONFIGURED, invoke=lambda f, p: calls.append((f, p)))


def test_redrive_invokes_the_archiver_when_a_retry_step_is_due() -> None:
    """No archive due, but a retry root due (opstate.retry): the archiver's pass runs the
    retry pass after its archive pass, so it is invoked, naming the root; not before its time."""
    calls: list[tuple[str, bytes]] = []
    store = MemoryStore()
    ingest(store, OpEvent("batches/root", State.RUNNING, T, "poll", {}), clock_ns=lambda: T)
    record = store.get("batches/root")
    assert record is not None
    waiting = RetryState(RETRY_ACTIVE, created_ns=record.created_ns, due_ns=T + 60 * 10**9)
    assert store.set_retry("batches/root", 0, waiting)
    assert not redrive(
        store, CONFIGURED, invoke=lambda f, p: calls.append((f, p)), clock_ns=lambda: T
    )
    assert redrive(
        store, CONFIGURED, invoke=lambda f, p: calls.append((f, p)), clock_ns=lambda: T + 61 * 10**9
    )
    ((function, payload),) = calls
    assert function == CONFIGURED.archiver_function
    assert json.loads(payload)["first"] == "batches/root"


def test_an_invocation_fault_is_logged_not_raised() -> None:
    store = MemoryStore()
    ingest(store, OpEvent("batches/done", State.SUCCEEDED, T, "poll", {}), clock_ns=lambda: T)

    def broken(function: str, payload: bytes) -> None:
        raise RuntimeError("throttled")

    assert not redrive(store, CONFIGURED, invoke=broken)


def test_a_due_archive_near_its_deadline_is_reported_at_risk(monkeypatch) -> None:
    """A result no archiver picked up (no status: its trigger was lost) with less than the
    warning margin left is counted by the reconciler; one far from it, one past it (the
    archiver marks that expired) and a Google Cloud job (never copied) are not."""
    from opstate.outcomes import redrive as module

    counted: list[tuple[str, float]] = []
    monkeypatch.setattr(module, "count", lambda name, value=1: counted.append((name, value)))
    settings = Settings(
        archiver_function=CONFIGURED.archiver_function,
        results_retention_s=48 * 3600.0,
        results_warn_s=12 * 3600.0,
    )
    hour = 3600 * 10**9
    store = MemoryStore()
    for name, ended in (
        ("batches/near", T - 40 * hour),  # 8 h left
        ("batches/far", T - 1 * hour),  # 47 h left
        ("batches/past", T - 50 * hour),  # past its deadline
        ("projects/p/locations/us-central1/batchPredictionJobs/7", T - 40 * hour),
    ):
        ingest(store, OpEvent(name, State.SUCCEEDED, ended, "poll", {}), clock_ns=lambda e=ended: e)
    calls: list[tuple[str, bytes]] = []
    assert redrive(store, settings, invoke=lambda f, p: calls.append((f, p)), clock_ns=lambda: T)
    assert counted == [("ResultsAtRisk", 1)]
    entries = list(store.iter_archive_due(T))
    assert [e.record.name for e in module.at_risk(entries, settings, T)] == ["batches/near"]
    # A failed copy with its own (Gemini's) deadline: that deadline counts, not the retention.
    record = store.get("batches/far")
    assert record is not None
    assert store.set_archive(
        "batches/far",
        0,
        ArchiveState("failed", created_ns=record.created_ns, deadline_ns=T + 2 * hour, due_ns=T),
    )
    entries = list(store.iter_archive_due(T))
    assert sorted(e.record.name for e in module.at_risk(entries, settings, T)) == [
        "batches/far",
        "batches/near",
    ]
