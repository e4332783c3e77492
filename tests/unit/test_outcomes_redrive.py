"""The reconciler's re-drive of due archives: invoked only with a due archive, an archiver to
invoke and time left; a fault never escapes."""

from __future__ import annotations

import json

from opstate.config import Settings
from opstate.ingest import ingest
from opstate.model import OpEvent
from opstate.outcomes.redrive import redrive
from opstate.states import State
from opstate.store import MemoryStore
from opstate.store.port import ArchiveState

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


def test_an_invocation_fault_is_logged_not_raised() -> None:
    store = MemoryStore()
    ingest(store, OpEvent("batches/done", State.SUCCEEDED, T, "poll", {}), clock_ns=lambda: T)

    def broken(function: str, payload: bytes) -> None:
        raise RuntimeError("throttled")

    assert not redrive(store, CONFIGURED, invoke=broken)
