"""Discovery reads only what changed (issue 48): each listed page is one batched read of the
store (``get_many``: one ``BatchGetItem`` per 100 names on DynamoDB), a listed job whose state
and time the table already holds costs no further call, a changed one one conditional write.
Counted on moto with ``OPSTATE_DISCOVER=all`` and ``=tracked``; ``get_many`` on every store."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from opstate.config import Settings
from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.reconcile.run import reconcile_once
from opstate.store import StoreUnavailableError
from opstate.store.dynamodb import DynamoDBStore
from opstate.store.port import BatchReadingStore
from tests.support.clock import FakeClock
from tests.support.gemini_memory import MemoryGateway
from tests.support.stores import STORE_KINDS, Harness, harness_of

S = 1_000_000_000
T0 = 1_767_225_600 * S
SETTINGS = Settings(
    store_url="memory://",
    reconcile_workers=2,
    reconcile_max_pages=5,
    reconcile_max_rps=0,
    reconcile_safety_margin_s=10.0,
    reconcile_discover="all",
)


@pytest.fixture(params=STORE_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_of(request, tmp_path) as h:
        yield h


def test_get_many_reads_what_exists_on_every_store(harness: Harness) -> None:
    store = harness.store
    assert isinstance(store, BatchReadingStore)
    names = [f"batches/many-{i:03d}" for i in range(130)]
    for name in names[::2]:
        ingest(store, OpEvent(name, State.RUNNING, T0, "poll", {"k": name}), clock_ns=lambda: T0)
    found = store.get_many([*names, names[0], "batches/none"])
    assert set(found) == set(names[::2])
    for name, record in found.items():
        assert record == store.get(name)
    assert store.get_many([]) == {}


class Calls:
    """The DynamoDB calls a client makes, by operation."""

    def __init__(self, client: Any) -> None:
        self.calls: Counter[str] = Counter()
        client.meta.events.register("before-call.dynamodb", self._on)
        client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", self._update)

    def _on(self, model: Any = None, **_: Any) -> None:
        self.calls[model.name] += 1

    def _update(self, params: dict[str, Any], **_: Any) -> None:
        """A record write sets ``details_v``; a poll reschedule (``set_poll``) does not."""
        if "details_v" in params.get("ExpressionAttributeNames", {}).values():
            self.calls["record writes"] += 1

    def take(self) -> Counter[str]:
        taken, self.calls = self.calls, Counter()
        return taken


@pytest.fixture
def moto() -> Iterator[tuple[DynamoDBStore, Calls]]:
    from moto import mock_aws

    from tests.support.stores import dynamodb_client, dynamodb_harness

    with mock_aws():
        client = dynamodb_client()
        store = dynamodb_harness(client, kind="dynamodb-mock", shards=1).store
        assert isinstance(store, DynamoDBStore)
        yield store, Calls(client)


def _run(store: DynamoDBStore, gateway: MemoryGateway, now: int, settings: Settings) -> Any:
    return reconcile_once(store, gateway, settings=settings, clock=FakeClock(now))


def test_a_listing_that_did_not_change_is_one_batched_read_a_page(
    moto: tuple[DynamoDBStore, Calls],
) -> None:
    store, calls = moto
    gateway = MemoryGateway()
    names = [f"batches/listed-{i:03d}" for i in range(250)]  # 3 pages of 100
    for name in names:
        gateway.put(name, State.RUNNING, T0 - S)
        gateway.batch_list.append(name)

    first = _run(store, gateway, T0, SETTINGS)
    assert first.discovered == 250 and first.applied == 250
    made = calls.take()
    assert made["BatchGetItem"] == 3 and made["GetItem"] == 0
    assert made["PutItem"] == 250  # each new job: one create, no read before it

    again = _run(store, gateway, T0 + 60 * S, SETTINGS)
    assert again.discovered == 250 and again.dropped == 250
    made = calls.take()
    assert made["BatchGetItem"] == 3
    assert made["GetItem"] == made["PutItem"] == 0
    # What writes there are reschedule the entries due now (discovery read them: no request,
    # no record write): every record is still its first version.
    assert made["record writes"] == 0
    assert {r.version for r in store.get_many(names).values()} == {1}
    calls.take()

    # Two jobs moved on: each is one conditional write, still one batched read a page.
    gateway.put(names[7], State.SUCCEEDED, T0 + 30 * S)
    gateway.put(names[208], State.RUNNING, T0 + 40 * S)
    moved = _run(store, gateway, T0 + 120 * S, SETTINGS)
    assert moved.applied == 2 and moved.dropped == 248
    made = calls.take()
    assert made["BatchGetItem"] == 3 and made["GetItem"] == 0
    assert made["record writes"] == 2
    record = store.get(names[7])
    assert record is not None and record.state is State.SUCCEEDED and record.version == 2


def test_tracked_discovery_lists_and_reads_nothing(moto: tuple[DynamoDBStore, Calls]) -> None:
    store, calls = moto
    gateway = MemoryGateway()
    for i in range(150):
        gateway.put(f"batches/untracked-{i}", State.RUNNING, T0 - S)
        gateway.batch_list.append(f"batches/untracked-{i}")
    result = _run(store, gateway, T0, replace(SETTINGS, reconcile_discover="tracked"))
    assert result.discovered == 0
    made = calls.take()
    assert made["BatchGetItem"] == made["GetItem"] == made["PutItem"] == 0


def test_unprocessed_keys_are_asked_again_then_a_fault(
    moto: tuple[DynamoDBStore, Calls],
) -> None:
    store, _ = moto
    for i in range(3):
        ingest(store, OpEvent(f"batches/u{i}", State.PENDING, T0, "report", {}))
    real = store.client.batch_get_item
    seen: list[int] = []

    def partial(**request: Any) -> Any:
        """DynamoDB's answer under pressure: one key read, the rest handed back."""
        keys = request["RequestItems"][store.table_name]["Keys"]
        seen.append(len(keys))
        first = {store.table_name: {**request["RequestItems"][store.table_name], "Keys": keys[:1]}}
        answer = real(RequestItems=first)
        rest = keys[1:]
        if rest:
            answer["UnprocessedKeys"] = {
                store.table_name: {**request["RequestItems"][store.table_name], "Keys": rest}
            }
        return answer

    store.client.batch_get_item = partial
    found = store.get_many(["batches/u0", "batches/u1", "batches/u2"])
    assert set(found) == {"batches/u0", "batches/u1", "batches/u2"} and seen == [3, 2, 1]
    seen.clear()
    for i in range(3, 8):
        ingest(store, OpEvent(f"batches/u{i}", State.PENDING, T0, "report", {}))
    with pytest.raises(StoreUnavailableError, match="unprocessed"):
        store.get_many([f"batches/u{i}" for i in range(8)])
    assert seen == [8, 7, 6, 5]  # the bound: four calls, never a silent partial answer


# --- settled records: a final job listed again is not read again (issue 48) --------------------


class CountingReads:
    """The names a store is asked for by ``get_many`` (every store has it)."""

    def __init__(self, store: Any) -> None:
        self.names: list[str] = []
        real = store.get_many

        def get_many(names: Any) -> Any:
            self.names.extend(names)
            return real(names)

        store.get_many = get_many

    def take(self) -> list[str]:
        taken, self.names = self.names, []
        return taken


def test_a_final_job_listed_again_is_not_read_again_on_every_store(harness: Harness) -> None:
    """With the process's ``Settled`` (the AWS wiring keeps one per container), the second
    listing reads only the jobs not yet final; a final one moved on at Gemini (a later time)
    is read and applied; the decisions and counts are those of the runs without it."""
    from opstate.reconcile.discovery import Settled

    store = harness.store
    reads = CountingReads(store)
    gateway = MemoryGateway()
    done = [f"batches/done-{i:02d}" for i in range(30)]
    open_ = [f"batches/open-{i:02d}" for i in range(5)]
    for name in done:
        gateway.put(name, State.SUCCEEDED, T0 - S)
    for name in open_:
        gateway.put(name, State.RUNNING, T0 - S)
    gateway.batch_list.extend([*done, *open_])
    settled = Settled()

    def listing(now: int) -> Any:
        return reconcile_once(
            store, gateway, settings=SETTINGS, clock=FakeClock(now), settled=settled
        )

    first = listing(T0)
    assert first.discovered == 35 and first.applied == 35
    assert sorted(reads.take()) == sorted([*done, *open_])
    assert len(settled) == 30

    again = listing(T0 + 60 * S)
    assert again.discovered == 35 and again.dropped == 35 and again.applied == 0
    assert sorted(reads.take()) == sorted(open_)  # the final ones come from memory

    # One job ends, one final job's time moves on at Gemini: both are read and applied.
    gateway.put(open_[0], State.SUCCEEDED, T0 + 10 * S)
    gateway.put(done[3], State.SUCCEEDED, T0 + 20 * S)
    moved = listing(T0 + 120 * S)
    assert moved.applied == 2 and moved.dropped == 33
    assert sorted(reads.take()) == sorted([done[3], *open_])
    assert len(settled) == 31
    for name, time in ((open_[0], T0 + 10 * S), (done[3], T0 + 20 * S)):
        record = store.get(name)
        assert record is not None and record.state is State.SUCCEEDED
        assert record.update_time_ns == time and record.version == 2
    assert sorted(reads.take()) == []
    listing(T0 + 180 * S)
    assert sorted(reads.take()) == sorted(open_[1:])


def test_a_kept_record_older_than_the_store_s_is_read_before_anything_applies(
    harness: Harness,
) -> None:
    """The kept record is a floor, not the store's record: a webhook moved the store past it
    (a later time), Gemini's listing shows a time between the two; against the kept record it
    would apply, so the store is read, and against the store's record it drops."""
    from opstate.reconcile.discovery import Settled

    store = harness.store
    reads = CountingReads(store)
    gateway = MemoryGateway()
    name = "batches/refreshed"
    gateway.put(name, State.SUCCEEDED, T0)
    gateway.batch_list.append(name)
    settled = Settled()
    reconcile_once(store, gateway, settings=SETTINGS, clock=FakeClock(T0), settled=settled)
    assert reads.take() == [name] and len(settled) == 1
    pushed = ingest(store, OpEvent(name, State.SUCCEEDED, T0 + 30 * S, "webhook", {}))
    assert pushed.applied
    gateway.put(name, State.SUCCEEDED, T0 + 10 * S)
    result = reconcile_once(
        store, gateway, settings=SETTINGS, clock=FakeClock(T0 + 60 * S), settled=settled
    )
    assert reads.take() == [name]
    assert result.applied == 0 and result.dropped == 1
    record = store.get(name)
    assert record is not None and record.update_time_ns == T0 + 30 * S and record.version == 2


def test_a_container_reads_no_listed_final_job_twice_on_dynamodb(
    moto: tuple[DynamoDBStore, Calls],
) -> None:
    """Counted on moto: 250 final jobs listed; the first listing of a container is one
    ``BatchGetItem`` a page, the next ones none."""
    from opstate.reconcile.discovery import Settled

    store, calls = moto
    gateway = MemoryGateway()
    names = [f"batches/final-{i:03d}" for i in range(250)]
    for name in names:
        gateway.put(name, State.SUCCEEDED, T0 - S)
        gateway.batch_list.append(name)
    settled = Settled()
    for minute in range(3):
        reconcile_once(
            store,
            gateway,
            settings=SETTINGS,
            clock=FakeClock(T0 + minute * 60 * S),
            settled=settled,
        )
    made = calls.take()
    assert made["BatchGetItem"] == 3 and made["PutItem"] == 250
    assert made["GetItem"] == made["record writes"] == 0
    fresh = reconcile_once(
        store, gateway, settings=SETTINGS, clock=FakeClock(T0), settled=Settled()
    )
    assert fresh.dropped == 250 and calls.take()["BatchGetItem"] == 3  # a new container reads


def test_settled_keeps_final_records_only_up_to_its_limit() -> None:
    from opstate.domain.model import OpRecord, Reason
    from opstate.reconcile.discovery import Settled

    settled = Settled(limit=2)

    def final(name: str, time: int = T0) -> OpRecord:
        return OpRecord(name, State.SUCCEEDED, time, 1, "poll")

    settled.keep(OpRecord("batches/open", State.RUNNING, T0, 1, "poll"))
    assert len(settled) == 0
    for name in ("batches/a", "batches/b", "batches/c"):
        settled.keep(final(name))
    assert len(settled) == 2
    listed = OpEvent("batches/a", State.SUCCEEDED, T0, "poll", {})
    assert settled.dropping(listed, T0) is None  # the oldest kept went first
    for name in ("batches/b", "batches/c"):
        same = OpEvent(name, State.SUCCEEDED, T0, "poll", {})
        drop = settled.dropping(same, T0)
        assert drop is not None and not drop.applied and drop.record == final(name)
        assert drop.reason is Reason.STALE_OR_EQUAL_UPDATE_TIME
        later = OpEvent(name, State.SUCCEEDED, T0 + 1, "poll", {})
        assert settled.dropping(later, T0) is None  # it would apply: the store is read
        other = OpEvent(name, State.FAILED, T0 + 1, "poll", {})
        conflict = settled.dropping(other, T0)  # a final state never changes
        assert conflict is not None and conflict.record == final(name)
        assert conflict.reason is Reason.TERMINAL_CONFLICT
    assert len(Settled(limit=0)) == 0
    nothing = Settled(limit=0)
    nothing.keep(final("batches/a"))
    assert len(nothing) == 0
