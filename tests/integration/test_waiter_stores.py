"""One contract, every waiter store (memory, SQLite, DynamoDB on moto): bounded, idempotent,
ordered, removable; and a waiter never touches the operation's record (version, row, item).
Also ``poll_state`` (the lost mark the condition reads) on every record store."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.ingest import ingest
from opstate.store.port import PollState
from opstate.waiters.dynamodb import DynamoDBWaiterStore
from opstate.waiters.memory import MemoryWaiterStore
from opstate.waiters.model import Target, Waiter, When
from opstate.waiters.port import TooManyWaitersError, WaiterStore
from opstate.waiters.sqlite import SQLiteWaiterStore
from tests.support.stores import harness_for, shared_client
from tests.support.template import create_table_from_template

T0 = parse_time("2026-06-01T10:00:00Z")
KINDS = ("memory", "sqlite", "dynamodb-mock")


def create_waiters_table(client: Any) -> str:
    """A new waiters table shaped by the template's ``WaitersTable``; its name."""
    name = f"waiters-{uuid.uuid4().hex[:10]}"
    create_table_from_template(client, name, "WaitersTable")
    return name


@pytest.fixture(params=KINDS)
def waiters(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WaiterStore]:
    if request.param == "memory":
        yield MemoryWaiterStore()
    elif request.param == "sqlite":
        yield SQLiteWaiterStore(tmp_path / "ops.db")
    else:
        from moto import mock_aws

        with mock_aws():
            client = shared_client()
            yield DynamoDBWaiterStore(create_waiters_table(client), client=client)


def w(token: str, name: str = "batches/a", when: When = When.TERMINAL, t: int = T0) -> Waiter:
    return Waiter(name, Target.STEP_FUNCTIONS, token, when, t)


def test_add_list_remove_round_trip(waiters: WaiterStore) -> None:
    assert waiters.list("batches/a") == []
    assert waiters.add(w("t2", t=T0 + 2), 5) is True
    assert waiters.add(w("t1", when=When.ARCHIVED, t=T0 + 1), 5) is True
    durable = Waiter("batches/a", Target.LAMBDA_DURABLE, "cb", When.TERMINAL, T0 + 3)
    assert waiters.add(durable, 5) is True
    assert waiters.list("batches/a") == [
        w("t1", when=When.ARCHIVED, t=T0 + 1),
        w("t2", t=T0 + 2),
        durable,
    ]
    waiters.remove("batches/a", w("t2").waiter_id)
    waiters.remove("batches/a", w("t2").waiter_id)  # already gone: no error
    assert [x.token for x in waiters.list("batches/a")] == ["t1", "cb"]
    assert waiters.list("batches/b") == []


def test_the_same_waiter_is_kept_once(waiters: WaiterStore) -> None:
    assert waiters.add(w("t"), 2) is True
    assert waiters.add(w("t", t=T0 + 9), 2) is False
    assert waiters.list("batches/a") == [w("t")]


def test_at_most_limit_per_operation_and_removal_frees_a_place(waiters: WaiterStore) -> None:
    for i in range(3):
        waiters.add(w(f"t{i}", t=T0 + i), 3)
    with pytest.raises(TooManyWaitersError):
        waiters.add(w("t9"), 3)
    assert waiters.add(w("t0"), 3) is False  # a repeat is not refused by the bound
    assert waiters.add(w("x", name="batches/b"), 3) is True
    waiters.remove("batches/a", w("t1").waiter_id)
    assert waiters.add(w("t9", t=T0 + 9), 3) is True
    assert [x.token for x in waiters.list("batches/a")] == ["t0", "t2", "t9"]


def test_concurrent_registrations_never_exceed_the_bound(tmp_path: Path) -> None:
    store = SQLiteWaiterStore(tmp_path / "ops.db")
    results: list[bool | str] = []

    def register(i: int) -> None:
        try:
            results.append(SQLiteWaiterStore(tmp_path / "ops.db").add(w(f"t{i}", t=T0 + i), 4))
        except TooManyWaitersError:
            results.append("refused")

    threads = [threading.Thread(target=register, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 4 and results.count("refused") == 8
    assert len(store.list("batches/a")) == 4


def test_sqlite_waiters_leave_the_operations_table_alone(tmp_path: Path) -> None:
    from opstate.store.sqlite import SQLiteStore

    path = tmp_path / "ops.db"

    store = SQLiteStore(path)
    ingest(store, OpEvent("batches/a", State.RUNNING, T0, "report", {}), clock_ns=lambda: T0)
    before = store.raw_row("batches/a")
    waiters = SQLiteWaiterStore(path)
    waiters.add(w("t"), 3)
    waiters.remove("batches/a", w("t").waiter_id)
    waiters.add(w("u"), 3)
    assert store.raw_row("batches/a") == before
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert {"operations", "waiters"} <= tables


def test_dynamodb_waiters_leave_the_operations_item_alone(tmp_path: Path) -> None:
    from moto import mock_aws

    with mock_aws(), harness_for("dynamodb-mock", tmp_path=tmp_path, moto_endpoint=str) as h:
        ingest(h.store, OpEvent("batches/a", State.RUNNING, T0, "report", {}), clock_ns=lambda: T0)
        before = h.raw("batches/a")
        waiters = DynamoDBWaiterStore(create_waiters_table(h.client), client=h.client)
        waiters.add(w("t"), 3)
        waiters.remove("batches/a", w("t").waiter_id)
        assert h.raw("batches/a") == before
        items = h.client.scan(TableName=waiters.table_name)["Items"]
        # the counter item only, moved back to zero; tokens are gone with their waiters
        assert [(i["waiter_id"]["S"], i["n"]["N"]) for i in items] == [("#count", "0")]


@pytest.mark.parametrize("kind", ["memory", "sqlite", "dynamodb-mock"])
def test_poll_state_reads_the_lost_mark(kind: str, tmp_path: Path) -> None:
    from moto import mock_aws

    with mock_aws(), harness_for(kind, tmp_path=tmp_path, moto_endpoint=str) as h:
        store: Any = h.store
        assert store.poll_state("batches/a") is None
        ingest(store, OpEvent("batches/a", State.RUNNING, T0, "report", {}), clock_ns=lambda: T0)
        assert store.poll_state("batches/a").lost_ns == 0
        assert store.set_poll("batches/a", 1, PollState(lost_ns=T0 + 7, misses=3))
        poll = store.poll_state("batches/a")
        assert (poll.lost_ns, poll.misses) == (T0 + 7, 3)


def test_a_previous_release_sqlite_file_gains_waiters_and_keeps_its_record(tmp_path: Path) -> None:
    from opstate.store.sqlite import SQLiteStore
    from tests.integration.test_store_polls import LEGACY_SCHEMA

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(LEGACY_SCHEMA)
        conn.execute(
            "INSERT INTO operations VALUES (?, 'RUNNING', 1, ?, 2, 'batch', 'poll', '{}', ?, ?, ?,"
            " NULL)",
            ("batches/a", str(T0).zfill(20), T0, T0, str(T0).zfill(20)),
        )
    waiters = SQLiteWaiterStore(path)  # the previous release's file, opened by waiters first
    assert waiters.add(w("t"), 3) is True
    store = SQLiteStore(path)
    record = store.get("batches/a")
    assert record is not None and (record.state, record.version) == (State.RUNNING, 2)
    assert store.poll_state("batches/a") == PollState(due_ns=T0)
    assert [x.token for x in waiters.list("batches/a")] == ["t"]


@pytest.mark.parametrize("kind", ["sqlite", "dynamodb-mock"])
def test_random_sequences_match_the_memory_store(kind: str, tmp_path: Path) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from moto import mock_aws

    ops = st.lists(
        st.tuples(
            st.sampled_from(["add", "remove"]),
            st.sampled_from(["batches/a", "batches/b"]),
            st.integers(min_value=0, max_value=4),
        ),
        max_size=25,
    )

    with mock_aws():
        client = shared_client()

        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
        @given(sequence=ops)
        def check(sequence: list[tuple[str, str, int]]) -> None:
            if kind == "sqlite":
                db = tmp_path / f"{uuid.uuid4().hex}.db"
                real: WaiterStore = SQLiteWaiterStore(db)
            else:
                real = DynamoDBWaiterStore(create_waiters_table(client), client=client)
            model = MemoryWaiterStore()
            for op, name, i in sequence:
                waiter = w(f"t{i}", name=name, t=T0 + i)
                if op == "add":
                    outcomes = []
                    for store in (model, real):
                        try:
                            outcomes.append(store.add(waiter, 3))
                        except TooManyWaitersError:
                            outcomes.append("refused")
                    assert outcomes[0] == outcomes[1], (op, name, i)
                else:
                    model.remove(name, waiter.waiter_id)
                    real.remove(name, waiter.waiter_id)
                for n in ("batches/a", "batches/b"):
                    assert real.list(n) == model.list(n)

        check()
