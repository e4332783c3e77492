"""One run, two backends: Gemini API records and Google Cloud records each go to their own
gateway, under their own rate limit, backoff and breaker; a refused Cloud credential stops only
the Cloud lane, once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from opstate.config import Settings
from opstate.domain.events import Source
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.observability import metrics
from opstate.reconcile.gateway import AuthError, GatewayError, Listed, Scope
from opstate.reconcile.pacing import Backoff
from opstate.reconcile.run import reconcile_once
from opstate.store import MemoryStore
from tests.support.clock import FakeClock
from tests.support.gemini_memory import MemoryGateway

S = 1_000_000_000
T0 = 1_767_225_600 * S
JOBS = "projects/p1/locations/us-central1/batchPredictionJobs"
SETTINGS = Settings(
    store_url="memory://",
    reconcile_workers=1,
    reconcile_max_pages=0,
    reconcile_max_rps=0,
    google_cloud_max_rps=0,
)


class MemoryCloud(MemoryGateway):
    """``CloudGateway`` in memory: the memory gateway plus per-scope listings."""

    def __init__(self, scopes: Sequence[Scope] = ()) -> None:
        super().__init__()
        self._scopes = tuple(scopes)
        self.listed: dict[Scope, list[str]] = {}
        self.refuse: AuthError | None = None
        self.list_calls: list[Scope] = []

    @property
    def scopes(self) -> Sequence[Scope]:
        return self._scopes

    def batch_pages(self, scope: Scope, page_size: int) -> Iterator[Sequence[Listed]]:  # type: ignore[override]
        self.list_calls.append(scope)
        if self.refuse is not None:
            raise self.refuse
        names = self.listed.get(scope, [])
        for start in range(0, len(names), page_size):
            yield [
                (n, OpEvent(n, self.ops[n].state, self.ops[n].update_ns, Source.POLL, {}))
                for n in names[start : start + page_size]
            ]

    def fetch(self, record: OpRecord) -> OpEvent:
        if self.refuse is not None:
            with self._lock:
                self.requests[record.name] += 1
            raise self.refuse
        return super().fetch(record)


def track(store: MemoryStore, name: str) -> None:
    ingest(store, OpEvent(name, State.PENDING, T0, "report", {}), clock_ns=lambda: T0)


def rig(n_gemini: int, n_cloud: int) -> tuple[MemoryStore, MemoryGateway, MemoryCloud]:
    store, gemini, cloud = MemoryStore(), MemoryGateway(), MemoryCloud()
    for i in range(n_gemini):
        track(store, f"batches/g{i}")
        gemini.put(f"batches/g{i}", State.SUCCEEDED, T0 + S)
    for i in range(n_cloud):
        track(store, f"{JOBS}/{i}")
        cloud.put(f"{JOBS}/{i}", State.SUCCEEDED, T0 + S)
    return store, gemini, cloud


def test_each_record_goes_to_its_own_backend() -> None:
    store, gemini, cloud = rig(3, 4)
    result = reconcile_once(store, gemini, settings=SETTINGS, clock=FakeClock(T0 + S), cloud=cloud)
    assert result.polled == 7 and result.errors == 0
    assert set(gemini.requests) == {f"batches/g{i}" for i in range(3)}
    assert set(cloud.requests) == {f"{JOBS}/{i}" for i in range(4)}
    assert store.list_open(100) == []


def test_the_cloud_rate_limit_is_its_own() -> None:
    # 2 Cloud requests per second, the Gemini API unlimited: 8 Cloud polls wait ~3.5 s of
    # (fake) time, while 8 Gemini API polls alone would not wait at all.
    store, gemini, cloud = rig(0, 8)
    clock = FakeClock(T0 + S)
    s = replace(SETTINGS, google_cloud_max_rps=2.0)
    assert reconcile_once(store, gemini, settings=s, clock=clock, cloud=cloud).polled == 8
    assert 3.0 <= clock.slept <= 4.0
    store, gemini, cloud = rig(8, 0)
    clock = FakeClock(T0 + S)
    assert reconcile_once(store, gemini, settings=s, clock=clock, cloud=cloud).polled == 8
    assert clock.slept == 0.0


def test_a_refused_cloud_credential_is_reported_once_and_the_gemini_api_goes_on() -> None:
    metrics.clear_metrics()
    store, gemini, cloud = rig(3, 5)
    cloud.refuse = AuthError("Google refused the credentials: invalid_grant")
    result = reconcile_once(store, gemini, settings=SETTINGS, clock=FakeClock(T0 + S), cloud=cloud)
    assert sum(cloud.requests.values()) == 1  # the first refusal stops the lane
    assert sum(gemini.requests.values()) == 3
    assert result.errors == 1 and result.remaining_due == 4
    assert result.stopped_early is False
    assert list(metrics.metric_set["GoogleCloudAuthFailed"]["Value"]) == [1.0]
    metrics.clear_metrics()
    assert {r.name for r in store.list_open(100)} == {f"{JOBS}/{i}" for i in range(5)}


def test_a_tripped_cloud_breaker_stops_only_the_cloud_lane() -> None:
    store, gemini, cloud = rig(4, 6)
    for i in range(6):
        cloud.fail(f"{JOBS}/{i}", GatewayError("503", status=503, transient=True))
    trip = Backoff(base_s=0.01, max_s=0.01, trip_after=2)
    result = reconcile_once(
        store, gemini, settings=SETTINGS, clock=FakeClock(T0 + S), cloud=cloud, backoff=trip
    )
    assert sum(cloud.requests.values()) == 2
    assert sum(gemini.requests.values()) == 4
    assert result.stopped_early is False
    assert {r.name for r in store.list_open(100)} == {f"{JOBS}/{i}" for i in range(6)}


def test_discovery_lists_every_scope_and_stops_asking_a_refused_cloud() -> None:
    store, gemini = MemoryStore(), MemoryGateway()
    cloud = MemoryCloud(scopes=[("p1", "us-central1"), ("p2", "europe-west4")])
    other = "projects/p2/locations/europe-west4/batchPredictionJobs/9"
    cloud.put(f"{JOBS}/1", State.RUNNING, T0)
    cloud.put(other, State.SUCCEEDED, T0)
    cloud.listed = {("p1", "us-central1"): [f"{JOBS}/1"], ("p2", "europe-west4"): [other]}
    s = replace(SETTINGS, reconcile_max_pages=1)
    result = reconcile_once(store, gemini, settings=s, clock=FakeClock(T0 + S), cloud=cloud)
    assert result.discovered == 2
    assert store.get(other) is not None and store.get(f"{JOBS}/1") is not None
    refused = MemoryCloud(scopes=[("p1", "us-central1"), ("p2", "europe-west4")])
    refused.refuse = AuthError("no credentials")
    result = reconcile_once(
        MemoryStore(), gemini, settings=s, clock=FakeClock(T0 + S), cloud=refused
    )
    assert refused.list_calls == [("p1", "us-central1")]
    assert result.errors == 1


def test_without_a_cloud_gateway_cloud_records_are_never_requested() -> None:
    store, gemini, _ = rig(2, 3)
    result = reconcile_once(store, gemini, settings=SETTINGS, clock=FakeClock(T0 + S))
    assert sum(gemini.requests.values()) == 2
    assert result.errors == 1 and result.remaining_due == 2
