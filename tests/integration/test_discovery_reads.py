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
