"""Store harnesses for tests and benchmarks: every store kind behind one small wrapper; and
``DelegatingStore``, the base of the store wrappers, and ``CountingStore``.

A harness gives the store plus ``raw(name)``, the stored item/row as plain python values (or
None), so tests can check what is really written (open-index keys, ``expires_at``).
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from opstate.domain.model import OpRecord
from opstate.store import Due, MemoryStore, PollingStore, PollState, Store, WriteOutcome
from opstate.store.dynamodb import CLIENT_CONFIG, DynamoDBStore, deserialize_item, plain
from opstate.store.sqlite import SQLiteStore
from tests.support.template import create_table_from_template

STORE_KINDS = ("dynamodb-mock", "dynamodb-server", "sqlite", "memory")
QUARANTINE_KINDS = ("memory", "sqlite", "sqs")


class DelegatingStore:
    """Hands every call of the port to ``inner``. Wrappers (counting, pausing, fault-injecting)
    subclass it and override only the calls they change."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    def get(self, name: str) -> OpRecord | None:
        return self.inner.get(name)

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        return self.inner.put_if_absent(record)

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        return self.inner.replace_if_version(record, expected_version)

    def list_open(self, limit: int = 100) -> Sequence[OpRecord]:
        return self.inner.list_open(limit)

    def iter_all(self) -> Iterator[OpRecord]:
        return self.inner.iter_all()

    def iter_due(self, now_ns: int | None, page_size: int = 100) -> Iterator[Due]:
        return self._polling().iter_due(now_ns, page_size)

    def set_poll(self, name: str, version: int, poll: PollState) -> bool:
        return self._polling().set_poll(name, version, poll)

    def iter_marked(self) -> Iterator[Due]:
        return self._polling().iter_marked()

    def _polling(self) -> PollingStore:
        inner = self.inner
        assert isinstance(inner, PollingStore), type(inner).__name__
        return inner

    def close(self) -> None:
        self.inner.close()


class CountingStore(DelegatingStore):
    """Counts the port calls that do the work (get, put_if_absent, replace_if_version,
    list_open) on any store; thread-safe."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _hit(self, call: str) -> None:
        with self._lock:
            self.calls[call] += 1

    def total(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    def get(self, name: str) -> OpRecord | None:
        self._hit("get")
        return self.inner.get(name)

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        self._hit("put_if_absent")
        return self.inner.put_if_absent(record)

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        self._hit("replace_if_version")
        return self.inner.replace_if_version(record, expected_version)

    def list_open(self, limit: int = 100) -> Sequence[OpRecord]:
        self._hit("list_open")
        return self.inner.list_open(limit)

    def iter_due(self, now_ns: int | None, page_size: int = 100) -> Iterator[Due]:
        # Counted per entry read from the index (its share of a page, not a call).
        for entry in super().iter_due(now_ns, page_size):
            self._hit("iter_due_entries")
            yield entry

    def set_poll(self, name: str, version: int, poll: PollState) -> bool:
        self._hit("set_poll")
        return super().set_poll(name, version, poll)


@dataclass
class Harness:
    kind: str
    store: Store
    raw: Callable[[str], dict[str, Any] | None]
    client: Any = None  # the DynamoDB client, when there is one
    table: str | None = None


def unique_table() -> str:
    return f"ops-{uuid.uuid4().hex[:12]}"


def dynamodb_client(endpoint_url: str | None = None, config: Config | None = None) -> Any:
    kwargs: dict[str, Any] = {"region_name": "us-east-1", "config": config or CLIENT_CONFIG}
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
    return boto3.client("dynamodb", **kwargs)


@functools.lru_cache(maxsize=8)
def shared_client(endpoint_url: str | None = None) -> Any:
    """One client per endpoint for the session (building a client costs ~150 ms). Tests that
    register event hooks or stub a client build their own with ``dynamodb_client``."""
    return dynamodb_client(endpoint_url)


def dynamodb_harness(
    client: Any, *, kind: str, shards: int = 4, retention_days: int = 90, **kwargs: Any
) -> Harness:
    table = unique_table()
    create_table_from_template(client, table)
    store = DynamoDBStore(
        table, client=client, shards=shards, retention_days=retention_days, **kwargs
    )

    def raw(name: str) -> dict[str, Any] | None:
        item = client.get_item(TableName=table, Key={"name": {"S": name}}, ConsistentRead=True)
        found = item.get("Item")
        return plain(deserialize_item(found)) if found else None

    return Harness(kind, store, raw, client=client, table=table)


def sqlite_harness(path: Path, **kwargs: Any) -> Harness:
    store = SQLiteStore(path, **kwargs)
    return Harness("sqlite", store, store.raw_row)


def memory_harness() -> Harness:
    store = MemoryStore()

    def raw(name: str) -> dict[str, Any] | None:
        record = store.get(name)
        return None if record is None else {"version": record.version, "record": record}

    return Harness("memory", store, raw)


@contextmanager
def harness_for(
    kind: str, *, tmp_path: Path, moto_endpoint: Callable[[], str], **kwargs: Any
) -> Iterator[Harness]:
    """A fresh harness of ``kind``; ``moto_endpoint`` is called only for the server kind."""
    if kind == "dynamodb-mock":
        from moto import mock_aws

        with mock_aws():
            yield dynamodb_harness(shared_client(), kind=kind, **kwargs)
    elif kind == "dynamodb-server":
        harness = dynamodb_harness(shared_client(moto_endpoint()), kind=kind, **kwargs)
        try:
            yield harness
        finally:
            harness.client.delete_table(TableName=harness.table)
    elif kind == "sqlite":
        kwargs.pop("shards", None)
        harness = sqlite_harness(tmp_path / f"{uuid.uuid4().hex[:8]}.db", **kwargs)
        try:
            yield harness
        finally:
            harness.store.close()
    elif kind == "memory":
        yield memory_harness()
    else:
        raise ValueError(kind)


@contextmanager
def harness_of(request: Any, tmp_path: Path, **kwargs: Any) -> Iterator[Harness]:
    """``harness_for`` the kind a fixture is parametrised with (``params=STORE_KINDS``,
    ``request`` is its ``pytest.FixtureRequest``); the ``moto_server`` fixture is asked for
    only when the kind needs it."""

    def endpoint() -> str:
        return str(request.getfixturevalue("moto_server").endpoint)

    with harness_for(request.param, tmp_path=tmp_path, moto_endpoint=endpoint, **kwargs) as h:
        yield h


@contextmanager
def quarantine_for(kind: str, tmp_path: Path) -> Iterator[Any]:
    """A fresh, empty quarantine of ``kind`` (``QUARANTINE_KINDS``; sqs: moto in-process,
    messages visible again at once)."""
    from opstate.quarantine import MemoryQuarantine, SQLiteQuarantine, SqsQuarantine

    if kind == "memory":
        yield MemoryQuarantine()
    elif kind == "sqlite":
        yield SQLiteQuarantine(tmp_path / "q.db")
    elif kind == "sqs":
        from moto import mock_aws

        with mock_aws():
            sqs = boto3.client("sqs", region_name="us-east-1")
            url = sqs.create_queue(QueueName="quarantine")["QueueUrl"]
            yield SqsQuarantine(url, client=sqs, visibility_timeout_s=0)
    else:
        raise ValueError(kind)


def signed_app(store: Store, now_ns: int) -> Any:
    """The API over ``store`` as the webhook tests drive it: the suite's static signing secret
    (signatures checked at ``EVENT_TIMESTAMP``), default settings, a fixed ingest clock."""
    from opstate.api import create_app
    from opstate.config import Settings
    from opstate.signatures import StaticSecretsVerifier
    from tests.support.webhooks import EVENT_TIMESTAMP, TEST_SECRET

    return create_app(
        store=store,
        verifier=StaticSecretsVerifier([TEST_SECRET], clock_s=lambda: EVENT_TIMESTAMP),
        settings=Settings(),
        clock_ns=lambda: now_ns,
    )
