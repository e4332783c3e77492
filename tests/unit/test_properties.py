"""The properties that define correctness (Hypothesis).

(1) convergence: any true timeline, delivered shuffled and duplicated (also by concurrent
    writers), ends as the timeline's last event;
(2) no observer ever sees (rank, time) go backwards;
(3) applying an event twice equals applying it once;
(4) times: parse of format is the identity, and parsed order is instant order whatever the
    precision and offset of the text;
(5) details belong to a state: state-scoped keys are cleared on a state change, observation-
    scoped ones by any applied event that lacks them, the rest persist; and no sequence of
    events grows a record's details past the cap.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opstate.domain.details import MAX_DETAILS_BYTES
from opstate.domain.details import size as details_size
from opstate.domain.events import Source
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.reducer import OBSERVATION_SCOPED_KEYS, STATE_SCOPED_KEYS, apply_event
from opstate.domain.states import TERMINAL, State, rank
from opstate.domain.times import MAX_EVENT_NS, MAX_NS, NS_PER_SECOND, format_time, parse_time
from opstate.ingest import ingest, ingest_counted
from opstate.store import MemoryStore
from opstate.store.port import WriteOutcome

NAME = "batches/prop"
NON_TERMINAL = [s for s in State if s not in TERMINAL]
TERMINALS = sorted(TERMINAL)
SOURCES = [s.value for s in Source]

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
THREADED = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- strategies


@st.composite
def timelines(draw: st.DrawFn) -> list[OpEvent]:
    """A true timeline of one operation: ranks non-decreasing, at most one terminal state and
    only at the end, strictly increasing times (the first may be 0, "unknown")."""
    open_states = draw(st.lists(st.sampled_from(NON_TERMINAL), max_size=6))
    open_states.sort(key=rank)  # stable: keeps the random order within a rank
    states = list(open_states)
    if draw(st.booleans()) or not states:
        states.append(draw(st.sampled_from(TERMINALS)))
    start = draw(st.integers(0, 10**18))
    gaps = draw(st.lists(st.integers(1, 10**12), min_size=len(states), max_size=len(states)))
    times, t = [], start
    for gap in gaps:
        times.append(t)
        t += gap
    return [
        OpEvent(NAME, state, time, draw(st.sampled_from(SOURCES)), {"i": i, f"k{i}": True})
        for i, (state, time) in enumerate(zip(states, times, strict=True))
    ]


@st.composite
def deliveries(draw: st.DrawFn, timeline: Sequence[OpEvent]) -> list[OpEvent]:
    """Every event at least once, some several times, in any order."""
    extra = draw(st.lists(st.sampled_from(list(timeline)), max_size=2 * len(timeline)))
    return draw(st.permutations([*timeline, *extra]))


events = st.builds(
    OpEvent,
    name=st.just(NAME),
    state=st.sampled_from(list(State)),
    update_time_ns=st.integers(0, 50),  # a small range, so equal times are common
    source=st.sampled_from(SOURCES),
    details=st.dictionaries(st.sampled_from("abc"), st.integers(0, 3), max_size=2),
)

records = st.builds(
    OpRecord,
    name=st.just(NAME),
    state=st.sampled_from(list(State)),
    update_time_ns=st.integers(0, 50),
    version=st.integers(1, 10),
    source=st.sampled_from(SOURCES),
    details=st.dictionaries(st.sampled_from("abc"), st.integers(0, 3), max_size=2),
    created_ns=st.integers(0, 100),
    applied_ns=st.integers(0, 100),
)


def _fold(delivered: Sequence[OpEvent]) -> tuple[OpRecord | None, list[OpRecord]]:
    """Reduce events one by one; returns the final record and every record observed after
    each decision (applied or not)."""
    current: OpRecord | None = None
    seen: list[OpRecord] = []
    for now, event in enumerate(delivered, start=1):
        decision = apply_event(current, event, now_ns=now)
        if decision.applied:
            assert decision.record is not None
            assert decision.record.version == (current.version if current else 0) + 1
        current = decision.record
        assert current is not None
        seen.append(current)
    return current, seen


def _assert_never_backwards(keys: Sequence[tuple[int, int]]) -> None:
    for before, after in itertools.pairwise(keys):
        assert after >= before, (before, after)


class ObservedStore(MemoryStore):
    """A MemoryStore that logs every successful write in write order."""

    def __init__(self) -> None:
        super().__init__()
        self._log_lock = threading.Lock()
        self.writes: list[OpRecord] = []

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        with self._log_lock:
            outcome = super().put_if_absent(record)
            if outcome.ok:
                self.writes.append(record)
            return outcome

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        with self._log_lock:
            outcome = super().replace_if_version(record, expected_version)
            if outcome.ok:
                self.writes.append(record)
            return outcome


def _assert_write_log_is_monotonic(writes: Sequence[OpRecord]) -> None:
    assert [w.version for w in writes] == list(range(1, len(writes) + 1))
    keys = [w.order_key for w in writes]
    # every applied write strictly moves (rank, time) forward
    for before, after in itertools.pairwise(keys):
        assert after > before, (before, after)


# ---------------------------------------------------------------- (1) convergence


@PROPS
@given(data=st.data(), timeline=timelines())
def test_convergence_through_apply_event(data: st.DataObject, timeline: list[OpEvent]) -> None:
    delivered = data.draw(deliveries(timeline))
    final, _ = _fold(delivered)
    last = timeline[-1]
    assert final is not None
    assert (final.state, final.update_time_ns) == (last.state, last.update_time_ns)
    assert final.details["i"] == last.details["i"]  # the last event's details win
    # only timeline events are ever applied: the version is at most the timeline's length
    assert 1 <= final.version <= len(timeline)


@PROPS
@given(data=st.data(), timeline=timelines())
def test_convergence_through_ingest(data: st.DataObject, timeline: list[OpEvent]) -> None:
    delivered = data.draw(deliveries(timeline))
    store = ObservedStore()
    for event in delivered:
        ingest(store, event, sleep=lambda _s: None)
    final = store.get(NAME)
    last = timeline[-1]
    assert final is not None
    assert (final.state, final.update_time_ns) == (last.state, last.update_time_ns)
    assert final.details["i"] == last.details["i"]  # the last event's details win
    _assert_write_log_is_monotonic(store.writes)
    assert store.writes[-1] == final


@PROPS
@given(data=st.data(), timeline=timelines())
def test_delivery_order_never_matters(data: st.DataObject, timeline: list[OpEvent]) -> None:
    """Two different deliveries of the same timeline end in the same (state, time)."""
    a, _ = _fold(data.draw(deliveries(timeline)))
    b, _ = _fold(data.draw(deliveries(timeline)))
    assert a is not None and b is not None
    assert (a.state, a.update_time_ns) == (b.state, b.update_time_ns)


class _BarrierOnFirstRead(ObservedStore):
    """Every writer thread's first read waits for all the others: they all read the same
    record and then race on the conditional write, so lost races are certain."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self._barrier = threading.Barrier(parties, timeout=10)
        self._local = threading.local()

    def get(self, name: str) -> OpRecord | None:
        record = super().get(name)
        if not getattr(self._local, "waited", False):
            self._local.waited = True
            self._barrier.wait()
        return record


@THREADED
@given(data=st.data(), timeline=timelines(), writers=st.integers(2, 4))
def test_convergence_with_concurrent_writers(
    data: st.DataObject, timeline: list[OpEvent], writers: int
) -> None:
    streams = [data.draw(deliveries(timeline)) for _ in range(writers)]
    store = _BarrierOnFirstRead(writers)
    done = threading.Event()
    observed: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    conflicts: list[int] = []

    def write(stream: list[OpEvent]) -> None:
        try:
            for event in stream:
                ingested = ingest_counted(store, event, max_attempts=100, sleep=lambda _s: None)
                conflicts.append(ingested.conflicts)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def observe() -> None:
        while not done.is_set():
            # read around the barrier: the observer is not a writer
            record = MemoryStore.get(store, NAME)
            if record is not None:
                observed.append(record.order_key)

    threads = [threading.Thread(target=write, args=(s,)) for s in streams]
    observer = threading.Thread(target=observe)
    observer.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    done.set()
    observer.join(timeout=30)

    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    final = MemoryStore.get(store, NAME)
    last = timeline[-1]
    assert final is not None
    assert (final.state, final.update_time_ns) == (last.state, last.update_time_ns)
    assert final.details["i"] == last.details["i"]  # the last event's details win
    _assert_write_log_is_monotonic(store.writes)
    _assert_never_backwards(observed)
    # all writers read "absent" first, so all but one lost their first write
    assert sum(conflicts) >= writers - 1


# ---------------------------------------------------------------- (2) never backwards


@PROPS
@given(data=st.data(), timeline=timelines())
def test_no_observer_sees_a_true_timeline_go_backwards(
    data: st.DataObject, timeline: list[OpEvent]
) -> None:
    _, seen = _fold(data.draw(deliveries(timeline)))
    _assert_never_backwards([r.order_key for r in seen])


@PROPS
@given(delivered=st.lists(events, min_size=1, max_size=25))
def test_no_observer_sees_any_event_stream_go_backwards(delivered: list[OpEvent]) -> None:
    """Even for streams no true timeline produces (conflicting terminals, rank drops, equal
    times), the record never moves backwards and a terminal state never changes."""
    _, seen = _fold(delivered)
    _assert_never_backwards([r.order_key for r in seen])
    first_terminal = next((r.state for r in seen if r.terminal), None)
    if first_terminal is not None:
        after = seen[[r.state for r in seen].index(first_terminal) :]
        assert {r.state for r in after} == {first_terminal}


# ---------------------------------------------------------------- (3) idempotence


@PROPS
@given(current=st.none() | records, event=events)
def test_applying_twice_equals_applying_once(current: OpRecord | None, event: OpEvent) -> None:
    once = apply_event(current, event, now_ns=7)
    twice = apply_event(once.record, event, now_ns=8)
    assert not twice.applied
    assert twice.record == once.record


@PROPS
@given(data=st.data(), timeline=timelines())
def test_redelivering_a_seen_event_changes_nothing(
    data: st.DataObject, timeline: list[OpEvent]
) -> None:
    delivered = data.draw(deliveries(timeline))
    final, _ = _fold(delivered)
    again = data.draw(st.sampled_from(delivered))
    decision = apply_event(final, again, now_ns=10**6)
    assert not decision.applied
    assert decision.record == final


# ---------------------------------------------------------------- (4) times

DAY_NS = 86_400 * NS_PER_SECOND
EPOCH = datetime(1970, 1, 1)
# instants whose wall time under any offset stays within years 1970..9999
instants = st.integers(DAY_NS, MAX_NS - DAY_NS)
offsets = st.integers(-(23 * 60 + 59), 23 * 60 + 59)  # minutes
precisions = st.integers(0, 9)


def _truncate(ns: int, precision: int) -> int:
    step: int = 10 ** (9 - precision)
    return ns - ns % step


def _render(ns: int, precision: int, offset_min: int, upper_t: bool, utc: str = "Z") -> str:
    """RFC3339 text of ``ns`` with ``precision`` fractional digits (truncated) at an offset
    (``utc`` spells offset 0); written independently of format_time."""
    seconds, frac = divmod(_truncate(ns, precision), NS_PER_SECOND)
    wall = EPOCH + timedelta(seconds=seconds, minutes=offset_min)
    text = (
        f"{wall.year:04d}-{wall.month:02d}-{wall.day:02d}{'T' if upper_t else 't'}"
        f"{wall.hour:02d}:{wall.minute:02d}:{wall.second:02d}"
    )
    if precision:
        text += "." + f"{frac:09d}"[:precision]
    if offset_min == 0:
        return text + utc
    sign = "-" if offset_min < 0 else "+"
    hours, minutes = divmod(abs(offset_min), 60)
    return f"{text}{sign}{hours:02d}:{minutes:02d}"


@PROPS
@given(ns=st.integers(0, MAX_EVENT_NS))
def test_parse_of_format_is_the_identity(ns: int) -> None:
    text = format_time(ns)
    assert parse_time(text) == ns
    assert format_time(parse_time(text)) == text


@PROPS
@given(
    ns=instants,
    precision=precisions,
    offset=offsets | st.just(0),
    upper_t=st.booleans(),
    utc=st.sampled_from(["Z", "z", "+00:00", "-00:00"]),
)
def test_any_rendering_parses_to_the_truncated_instant(
    ns: int, precision: int, offset: int, upper_t: bool, utc: str
) -> None:
    text = _render(ns, precision, offset, upper_t, utc)
    assert parse_time(text) == _truncate(ns, precision)


@PROPS
@given(
    a=instants,
    b=instants | st.integers(-(10**10), 10**10).map(lambda d: DAY_NS + 10**12 + d),
    precision=precisions,
    offset_a=offsets,
    offset_b=offsets,
    upper=st.booleans(),
)
def test_parsed_order_is_instant_order(
    a: int, b: int, precision: int, offset_a: int, offset_b: int, upper: bool
) -> None:
    pa = parse_time(_render(a, precision, offset_a, upper))
    pb = parse_time(_render(b, precision, offset_b, not upper))
    ta, tb = _truncate(a, precision), _truncate(b, precision)
    # the parsed order is exactly the order of the instants at the rendered precision ...
    assert (pa < pb, pa == pb, pa > pb) == (ta < tb, ta == tb, ta > tb)
    # ... which never contradicts the order of the exact instants
    if pa < pb:
        assert a < b
    if a < b:
        assert pa <= pb
    if precision == 9:
        assert (pa < pb, pa == pb) == (a < b, a == b)


@PROPS
@given(
    micros=st.integers(DAY_NS // 1000, (MAX_NS - DAY_NS) // 1000),
    offset=offsets,
)
def test_aware_datetimes_parse_to_their_instant(micros: int, offset: int) -> None:
    tz = timezone(timedelta(minutes=offset))
    value = (EPOCH + timedelta(microseconds=micros)).replace(tzinfo=UTC).astimezone(tz)
    assert parse_time(value) == micros * 1000


# ---------------------------------------------------------------- (5) details belong to a state

DETAIL_KEYS = [
    *sorted(STATE_SCOPED_KEYS | OBSERVATION_SCOPED_KEYS),
    *["user_metadata", "output_file_uri", "video_uri", "mine"],
]
scoped_details = st.dictionaries(st.sampled_from(DETAIL_KEYS), st.integers(0, 3), max_size=5)
scoped_records = st.builds(
    OpRecord,
    name=st.just(NAME),
    state=st.sampled_from(list(State)),
    update_time_ns=st.integers(0, 50),
    version=st.integers(1, 10),
    source=st.sampled_from(SOURCES),
    details=scoped_details,
)
scoped_events = st.builds(
    OpEvent,
    name=st.just(NAME),
    state=st.sampled_from(list(State)),
    update_time_ns=st.integers(0, 50),
    source=st.sampled_from(SOURCES),
    details=scoped_details,
)


@PROPS
@given(current=scoped_records, event=scoped_events)
def test_details_belong_to_a_state(current: OpRecord, event: OpEvent) -> None:
    decision = apply_event(current, event)
    if not decision.applied:
        assert decision.record == current
        return
    assert decision.record is not None
    details = decision.record.details
    # The event's own details always land.
    assert {k: details[k] for k in event.details} == dict(event.details)
    for key, value in current.details.items():
        if key in event.details:
            continue
        if key in OBSERVATION_SCOPED_KEYS:
            assert key not in details  # true only until the operation is seen again
        elif key in STATE_SCOPED_KEYS and decision.state_changed:
            assert key not in details  # described the state that was left
        else:
            assert details[key] == value  # persists
    assert set(details) <= set(current.details) | set(event.details)


@PROPS
@given(
    sizes=st.lists(st.integers(1, 40_000), min_size=1, max_size=12),
    states=st.lists(st.sampled_from(NON_TERMINAL), min_size=12, max_size=12),
)
def test_no_sequence_of_events_grows_details_past_the_cap(
    sizes: list[int], states: list[State]
) -> None:
    current: OpRecord | None = None
    for i, n in enumerate(sizes):
        states_so_far = sorted(states[: i + 1], key=rank)
        event = OpEvent(NAME, states_so_far[-1], i + 1, "report", {f"k{i}": "x" * n})
        decision = apply_event(current, event)
        assert decision.applied and decision.record is not None
        current = decision.record
        assert details_size(current.details) <= MAX_DETAILS_BYTES
        assert current.details[f"k{i}"] == "x" * n  # the newest details always fit
    final = apply_event(current, OpEvent(NAME, State.SUCCEEDED, 10**6, "webhook", {"u": 1}))
    assert final.applied and final.record is not None and final.record.details["u"] == 1
