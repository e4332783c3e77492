"""The reconciler's re-drive of due archives: invoked only with a due archive, an archiver to
invoke and time left; a fault never escapes."""

from __future__ import annotations

import json
from collections.abc import Iterator

from opstate.config import Settings
from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.outcomes.redrive import redrive
from opstate.store import MemoryStore
from opstate.store.port import ArchiveEntry, ArchiveState
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


class CountingStore(MemoryStore):
    """A memory store counting the re-drive's looks (its archive-queue reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    def iter_archive_due(self, now_ns: int) -> Iterator[ArchiveEntry]:
        self.looks += 1
        return super().iter_archive_due(now_ns)


def test_the_cadence_looks_every_15_minutes_while_nothing_is_due() -> None:
    """Issue 48: the re-drive's 8 Queries ran on every run (288 a day), almost all on empty
    shards. With a cadence, an empty look is followed by the next one 15 minutes later; a lost
    trigger in between waits for it (at most 15 minutes plus one run), never for ever."""
    from opstate.outcomes.redrive import REDRIVE_EVERY_S, Cadence

    minute = 60 * 10**9
    calls: list[tuple[str, bytes]] = []
    store = CountingStore()
    cadence = Cadence()
    assert REDRIVE_EVERY_S == 900.0

    def run(at: int) -> bool:
        return redrive(
            store,
            CONFIGURED,
            invoke=lambda f, p: calls.append((f, p)),
            clock_ns=lambda: at,
            cadence=cadence,
        )

    assert not run(T)  # a new container looks at once: nothing due
    assert store.looks == 1
    # A job ends and its stream trigger is lost: the runs 5 and 10 minutes later do not look.
    ingest(store, OpEvent("batches/done", State.SUCCEEDED, T, "poll", {}), clock_ns=lambda: T)
    assert not run(T + 5 * minute)
    assert not run(T + 10 * minute)
    assert store.looks == 1 and calls == []
    assert run(T + 15 * minute)  # the next look finds it
    assert store.looks == 2 and len(calls) == 1
    # A look that found work is followed by one at the next run (the archiver may have left
    # it pending with a short backoff).
    assert run(T + 20 * minute)
    assert store.looks == 3
    record = store.get("batches/done")
    assert record is not None
    assert store.set_archive(
        "batches/done", 0, ArchiveState("archived", created_ns=record.created_ns)
    )
    assert not run(T + 25 * minute)  # empty again: quiet for 15 minutes
    assert not run(T + 30 * minute)
    assert store.looks == 4


def test_the_cadence_looks_again_at_the_next_run_after_a_failed_invocation() -> None:
    from opstate.outcomes.redrive import Cadence

    minute = 60 * 10**9
    store = CountingStore()
    cadence = Cadence()
    ingest(store, OpEvent("batches/done", State.SUCCEEDED, T, "poll", {}), clock_ns=lambda: T)

    def broken(function: str, payload: bytes) -> None:
        raise RuntimeError("throttled")

    assert not redrive(store, CONFIGURED, invoke=broken, clock_ns=lambda: T, cadence=cadence)
    calls: list[tuple[str, bytes]] = []
    assert redrive(
        store,
        CONFIGURED,
        invoke=lambda f, p: calls.append((f, p)),
        clock_ns=lambda: T + 5 * minute,
        cadence=cadence,
    )
    assert store.looks == 2 and len(calls) == 1
