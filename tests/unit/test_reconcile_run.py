"""The reconcile run against an in-memory gateway, a memory store and a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opstate.config import Settings, parse_overdue
from opstate.domain.model import Decision, OpEvent, OpRecord
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.reconcile.gateway import GatewayError
from opstate.reconcile.pacing import TokenBucket
from opstate.reconcile.run import MarkDecision, RunDecision, RunResult, reconcile_once
from opstate.reconcile.schedule import Mark, Schedule
from opstate.store import MemoryStore
from tests.support.clock import FakeClock
from tests.support.gemini_memory import MemoryGateway

S = 1_000_000_000
MIN = 60 * S
HOUR = 3600 * S
T0 = 1_767_225_600 * S  # 2026-01-01T00:00:00Z
RUN_EVERY = 5 * MIN
VEO = "models/veo-3.1-generate-preview/operations/v1"
SETTINGS = Settings(
    store_url="memory://",
    reconcile_workers=2,
    reconcile_max_pages=0,
    reconcile_max_rps=0,
    reconcile_safety_margin_s=10.0,
)


class Rig:
    def __init__(self, settings: Settings = SETTINGS, start_ns: int = T0) -> None:
        self.store = MemoryStore()
        self.gateway = MemoryGateway()
        self.clock = FakeClock(start_ns)
        self.settings = settings
        self.decisions: list[RunDecision] = []

    def track(self, name: str, state: State, t_ns: int, *, created_ns: int | None = None) -> None:
        """Register ``name`` as the application would (PUT), created at ``created_ns``."""
        ingest(
            self.store,
            OpEvent(name, state, t_ns, "report", {}),
            clock_ns=lambda: t_ns if created_ns is None else created_ns,
        )

    def run(self, budget_s: float | None = None) -> RunResult:
        remaining = None
        if budget_s is not None:
            deadline = self.clock.now_ns() + int(budget_s * S)

            def remaining() -> int:
                return self.clock.remaining_ms(deadline)

        return reconcile_once(
            self.store,
            self.gateway,
            settings=self.settings,
            remaining_ms=remaining,
            clock=self.clock,
            on_decision=self.decisions.append,
        )

    def runs(self, n: int) -> list[RunResult]:
        out = []
        for _ in range(n):
            out.append(self.run())
            self.clock.advance(RUN_EVERY / S)
        return out

    def marks(self, mark: Mark) -> list[MarkDecision]:
        return [d for d in self.decisions if isinstance(d, MarkDecision) and d.mark is mark]

    def record(self, name: str) -> OpRecord:
        record = self.store.get(name)
        assert record is not None
        return record


def test_starvation_reproduction_finished_operation_is_terminal_within_three_runs() -> None:
    """Open limit 3, three 404 operations sorting oldest, one finished video: the old
    reconciler polled only the three 404s forever; now the video is terminal within 3 runs."""
    rig = Rig(replace(SETTINGS, reconcile_open_limit=3))
    for i in range(3):
        rig.track(f"batches/gone{i}", State.PENDING, T0 - HOUR + i)
        rig.gateway.remove(f"batches/gone{i}")
    rig.track(VEO, State.PENDING, T0 - 10 * MIN)
    rig.gateway.put(VEO, State.SUCCEEDED, T0 - MIN)
    runs = 0
    while rig.record(VEO).state is not State.SUCCEEDED and runs < 3:
        rig.run()
        runs += 1
        rig.clock.advance(RUN_EVERY / S)
    assert rig.record(VEO).state is State.SUCCEEDED
    assert runs <= 3
    assert rig.gateway.requests[VEO] == 1
    # The 404s keep their record and state, and are not lost after minutes.
    for i in range(3):
        assert rig.record(f"batches/gone{i}").state is State.PENDING
    assert rig.marks(Mark.LOST) == []


def test_new_operations_are_polled_every_run_old_ones_back_off_to_the_cap() -> None:
    rig = Rig()
    rig.track("batches/new", State.RUNNING, T0)
    rig.track("batches/old", State.RUNNING, T0 - 10 * HOUR, created_ns=T0 - 10 * HOUR)
    rig.gateway.put("batches/new", State.RUNNING, T0)
    rig.gateway.put("batches/old", State.RUNNING, T0 - 10 * HOUR)
    rig.runs(3)  # 0, 5, 10 minutes: "new" is younger than 15 minutes
    assert rig.gateway.requests["batches/new"] == 3
    assert rig.gateway.requests["batches/old"] == 1  # due again only 30 minutes later
    rig.runs(4)  # 15..30 minutes
    assert rig.gateway.requests["batches/old"] == 2


def test_polled_only_kinds_stay_on_the_faster_side_and_idle_interactions_go_slow() -> None:
    schedule = Schedule()
    old = T0 - 10 * HOUR
    imp = OpRecord("fileSearchStores/s/operations/o", State.RUNNING, old, 1, "poll", {}, old)
    batch = OpRecord("batches/b", State.RUNNING, old, 1, "poll", {}, old)
    idle = OpRecord("interactions/i", State.REQUIRES_ACTION, T0, 1, "poll", {}, T0)
    running = replace(idle, state=State.RUNNING)
    assert schedule.interval_s(imp, T0) == 600
    assert schedule.interval_s(batch, T0) == 1800
    assert schedule.interval_s(idle, T0) == 1800  # brand new, but waiting for input
    assert schedule.interval_s(running, T0) == 0


def test_unchanged_answer_touches_no_record_only_the_schedule() -> None:
    rig = Rig()
    rig.track("batches/a", State.RUNNING, T0 - S, created_ns=T0 - HOUR)
    rig.gateway.put("batches/a", State.RUNNING, T0 - S)
    before = rig.record("batches/a")
    rig.run()
    assert rig.record("batches/a") == before
    dropped = [d for d in rig.decisions if isinstance(d, Decision)]
    assert [str(d.reason) for d in dropped] == ["stale-or-equal-update-time"]
    poll = rig.store.poll_state("batches/a")
    assert poll is not None and poll.due_ns >= T0 + 7 * MIN  # 1/8 of its hour


def test_a_young_unchanged_answer_leaves_even_the_schedule_and_is_polled_next_run() -> None:
    """Issue 48: due at the next run either way, so the write that would say so is held."""
    rig = Rig()
    rig.track("batches/a", State.RUNNING, T0 - S)
    rig.gateway.put("batches/a", State.RUNNING, T0 - S)
    before = rig.store.poll_state("batches/a")
    rig.runs(3)
    assert rig.store.poll_state("batches/a") == before
    assert rig.gateway.requests["batches/a"] == 3


def test_paging_covers_every_due_operation_across_runs_each_once() -> None:
    rig = Rig(replace(SETTINGS, reconcile_open_limit=40))
    names = [f"batches/op{i:03d}" for i in range(100)]
    for i, name in enumerate(names):
        rig.track(name, State.RUNNING, T0 - 10 * HOUR + i, created_ns=T0 - 10 * HOUR)
        rig.gateway.put(name, State.RUNNING, T0 - 10 * HOUR + i)
    results = rig.runs(3)
    assert [r.polled for r in results] == [40, 40, 20]
    assert all(rig.gateway.requests[n] == 1 for n in names)
    assert results[0].stopped_early and results[0].remaining_due >= 1


def test_budget_stops_starting_work_and_the_next_run_continues() -> None:
    rig = Rig(replace(SETTINGS, reconcile_max_rps=1.0, reconcile_workers=1))
    for i in range(30):
        rig.track(f"batches/b{i:02d}", State.RUNNING, T0 - HOUR + i, created_ns=T0 - HOUR)
        rig.gateway.put(f"batches/b{i:02d}", State.RUNNING, T0 - HOUR + i)
    first = rig.run(budget_s=20.0)  # 10 s margin: about 10 requests at 1 per second
    assert first.stopped_early
    assert 5 <= first.polled <= 12
    second = rig.run(budget_s=1000.0)
    assert first.polled + second.polled == 30
    assert sum(rig.gateway.requests.values()) == 30


def test_token_bucket_paces_requests_at_the_configured_rate() -> None:
    clock = FakeClock(T0)
    bucket = TokenBucket(5.0, clock)
    waits = [bucket.reserve() for _ in range(15)]
    assert waits[:5] == [0.0] * 5  # the burst
    assert waits[5:] == pytest.approx([0.2 * k for k in range(1, 11)])


def test_retry_after_on_429_is_honoured_before_the_next_request() -> None:
    rig = Rig(replace(SETTINGS, reconcile_workers=1))
    for name in ("batches/a", "batches/b"):
        rig.track(name, State.RUNNING, T0 - S)
        rig.gateway.put(name, State.RUNNING, T0 - S)
    rig.gateway.fail(
        "batches/a", GatewayError("429", status=429, transient=True, retry_after_s=7.0)
    )
    result = rig.run()
    assert result.errors == 1 and result.polled == 2
    assert rig.clock.slept >= 7.0
    # a 429 leaves the operation due: polled again next run
    rig.run()
    assert rig.gateway.requests["batches/a"] == 2


def test_lost_after_three_runs_spanning_a_day_announced_once_then_rejoins() -> None:
    rig = Rig()
    rig.track("batches/gone", State.RUNNING, T0 - S)
    rig.gateway.remove("batches/gone")
    for _ in range(60):  # 5 hours every 5 minutes, then once per 2 hours
        rig.run()
        rig.clock.advance(RUN_EVERY / S)
    assert rig.marks(Mark.LOST) == []  # many misses, but not yet a day
    for _ in range(12):
        rig.clock.advance(2 * 3600)
        rig.run()
    lost = rig.marks(Mark.LOST)
    assert len(lost) == 1
    assert lost[0].record.state is State.RUNNING
    assert rig.record("batches/gone").state is State.RUNNING  # last known state kept
    asked = rig.gateway.requests["batches/gone"]
    rig.clock.advance(3 * 3600)
    rig.run()
    assert rig.gateway.requests["batches/gone"] == asked  # out of the polling set
    assert [d.record.name for d in rig.store.iter_marked()] == ["batches/gone"]
    # Seen again (a webhook or a report): it rejoins and the mark is cleared.
    later = rig.clock.now_ns()
    ingest(rig.store, OpEvent("batches/gone", State.RUNNING, later, "webhook", {}))
    poll = rig.store.poll_state("batches/gone")
    assert poll is not None and not poll.lost and poll.misses == 0
    rig.gateway.put("batches/gone", State.SUCCEEDED, later + S)
    rig.clock.advance(60)
    rig.run()
    assert rig.record("batches/gone").state is State.SUCCEEDED
    assert len(rig.marks(Mark.LOST)) == 1


def test_overdue_batch_announced_once() -> None:
    rig = Rig()
    rig.track("batches/slow", State.RUNNING, T0 - 23 * HOUR, created_ns=T0 - 23 * HOUR)
    rig.track(VEO, State.RUNNING, T0 - 23 * HOUR, created_ns=T0 - 23 * HOUR)
    rig.gateway.put("batches/slow", State.RUNNING, T0 - 23 * HOUR)
    rig.gateway.put(VEO, State.RUNNING, T0 - 23 * HOUR)
    for _ in range(36):  # three hours
        rig.run()
        rig.clock.advance(RUN_EVERY / S)
    overdue = rig.marks(Mark.OVERDUE)
    assert [d.record.name for d in overdue] == ["batches/slow"]  # videos have no threshold
    poll = rig.store.poll_state("batches/slow")
    assert poll is not None and poll.overdue_ns > 0
    assert rig.gateway.requests["batches/slow"] > 3  # still polled


def test_lost_and_overdue_in_the_same_poll_are_two_writes() -> None:
    rig = Rig(replace(SETTINGS, reconcile_overdue_hours="batch=1"))
    rig.track("batches/x", State.PENDING, T0 - 30 * HOUR, created_ns=T0 - 30 * HOUR)
    rig.gateway.remove("batches/x")
    # Two misses a day apart first, the overdue mark not yet reached (threshold 1 h).
    rig.run()
    overdue = rig.marks(Mark.OVERDUE)
    assert len(overdue) == 1
    rig.clock.advance(25 * 3600)
    rig.run()
    rig.clock.advance(3600)
    rig.run()
    assert len(rig.marks(Mark.LOST)) == 1
    assert len(rig.marks(Mark.OVERDUE)) == 1


def test_discovered_batches_are_rescheduled_without_a_request() -> None:
    rig = Rig(replace(SETTINGS, reconcile_max_pages=1))
    rig.track("batches/d", State.RUNNING, T0 - S, created_ns=T0 - HOUR)
    rig.gateway.put("batches/d", State.RUNNING, T0 - S)
    rig.gateway.batch_list.append("batches/d")
    result = rig.run()
    assert result.discovered == 1
    assert rig.gateway.requests["batches/d"] == 0
    poll = rig.store.poll_state("batches/d")
    assert poll is not None and poll.due_ns >= T0


def test_parse_overdue() -> None:
    assert parse_overdue("batch=24,video=2") == {"batch": 86400.0, "video": 7200.0}
    assert parse_overdue("batch=0") == {}
    with pytest.raises(ValueError, match="unknown kind"):
        parse_overdue("nope=3")


def test_a_job_record_is_never_polled_nor_marked_lost() -> None:
    # A job (issue 46) is opstate's own record: Gemini has no such resource, so a poll would
    # answer 404 and, after a day, mark the job lost. The retry pass moves it instead.
    rig = Rig()
    job = "jobs/0123456789abcdef01234567"
    rig.track(job, State.PENDING, T0 - 2 * HOUR, created_ns=T0 - 2 * HOUR)
    rig.track("batches/b1", State.RUNNING, T0)
    rig.gateway.put("batches/b1", State.RUNNING, T0)
    for _ in range(4):
        rig.run()
        rig.clock.advance(10 * HOUR / S)
    assert rig.gateway.requests.get(job, 0) == 0
    assert rig.gateway.requests["batches/b1"] >= 1
    assert rig.record(job).state is State.PENDING and rig.marks(Mark.LOST) == []
