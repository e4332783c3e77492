"""Feeding a job's parts (opstate.retry.feeding, issue 46) on the real google-genai client
against the fake Gemini enforcing the Batch API's limits (tests/support/fake_gemini_limits.py:
an enqueued-token cap per model, an open-batch limit, file bytes; a create over them answered
with the 429 body of a full queue), the shared enqueued count in the store's counters on
SQLite and on DynamoDB (moto)."""

from __future__ import annotations

import copy
import io
import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from opstate.config import Settings
from opstate.domain.parts import Bounds, split_hashed
from opstate.gemini.client import make_client
from opstate.retry import jobs
from opstate.retry.feeding import Feeder, FeedLimits, enqueued, open_slots
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits
from tests.support.stores import Harness, harness_of

API_KEY = "test-key"
MODEL = "gemini-2.5-flash"
CAP = 20_000  # opstate's estimate of tokens: half a line's bytes


@pytest.fixture
def client(fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch) -> Any:
    fake_gemini.api_key = API_KEY
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    return make_client(Settings(gemini_api_key=API_KEY, reconcile_http_timeout_s=10))


@pytest.fixture(params=["sqlite", "dynamodb-mock"])
def counters(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    harness: Harness
    with harness_of(request, tmp_path) as harness:
        yield harness.store


class MemoryPlan:
    """A plan holder: the plan under a revision (as a job's retry state keeps it)."""

    def __init__(self, plan: Mapping[str, Any]) -> None:
        self.rev = 0
        self.plan = copy.deepcopy(dict(plan))
        self.lock = threading.Lock()
        self.writes = 0

    def read(self) -> tuple[int, Mapping[str, Any]]:
        with self.lock:
            return self.rev, copy.deepcopy(self.plan)

    def write(self, rev: int, plan: Mapping[str, Any]) -> bool:
        with self.lock:
            if rev != self.rev:
                return False
            self.rev += 1
            self.writes += 1
            self.plan = copy.deepcopy(dict(plan))
            return True


def big_input(lines: int = 600, text_bytes: int = 250) -> bytes:
    """``lines`` request lines of about ``text_bytes`` bytes each, every one unique."""
    out = []
    for i in range(lines):
        text = f"question {i}: " + "lorem ipsum " * (text_bytes // 12)
        row = {"key": f"k{i}", "request": {"contents": [{"parts": [{"text": text}]}]}}
        out.append(json.dumps(row).encode() + b"\n")
    return b"".join(out)


def plan_for(data: bytes, cap: int = CAP) -> dict[str, Any]:
    parts = split_hashed(io.BytesIO(data), Bounds(cap, 10**9, 50_000))
    source = {"location": "mem://input", "sha256": "0" * 64, "rows": 0, "bytes": len(data)}
    return jobs.new_plan(jobs.new_job_id(), MODEL, source, parts)


def feeder(
    holder: MemoryPlan,
    counters: Any,
    client: Any,
    fake: FakeGemini,
    data: bytes,
    *,
    cap: int = CAP,
    max_batches: int = 100,
    lease_s: float = 900.0,
    clock: list[int] | None = None,
) -> Feeder:
    now = clock if clock is not None else [1_000 * 10**9]

    def is_open(name: str) -> bool:
        body = fake.resource(name) or {}
        return not body.get("done")

    return Feeder(
        holder,
        counters,
        client,
        lambda: iter([data[i : i + 4096] for i in range(0, len(data), 4096)]),
        is_open,
        FeedLimits(
            cap=cap, max_batches=max_batches, max_file_bytes=10**9, max_rows=50_000, lease_s=lease_s
        ),
        clock_ns=lambda: now[0],
    )


def finish_open(fake: FakeGemini) -> int:
    """Gemini runs every open batch to the end: one answer per input line."""
    finished = 0
    for name in fake.batches_created():
        body = fake.resource(name) or {}
        if body.get("done"):
            continue
        rows = [json.loads(line) for line in fake.batch_input(name).splitlines()]
        fake.run_batch(name, [{"key": r["key"], "response": {"candidates": []}} for r in rows])
        finished += 1
    return finished


def sent_in_order(fake: FakeGemini, holder: MemoryPlan) -> bytes:
    _, plan = holder.read()
    parts = sorted((p for p in plan["parts"] if p.get("batch")), key=lambda p: p["start"])
    return b"".join(fake.batch_input(p["batch"]) for p in parts)


def run_to_end(fake: FakeGemini, feed: Feeder, holder: MemoryPlan, passes: int = 60) -> None:
    for _ in range(passes):
        feed.step(every=True)
        _, plan = holder.read()
        if jobs.finished(plan):
            return
        finish_open(fake)
    raise AssertionError(f"the job did not finish: {jobs.summary(holder.read()[1], CAP)}")


def test_a_job_of_four_times_the_cap_finishes_every_line_once_within_every_limit(
    fake_gemini: FakeGemini, client: Any, counters: Any
) -> None:
    data = big_input()
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP}, max_open=3, max_file_bytes=10**6)
    holder = MemoryPlan(plan_for(data))
    parts = len(holder.plan["parts"])
    assert sum(p["tokens"] for p in holder.plan["parts"]) >= 4 * CAP
    feed = feeder(holder, counters, client, fake_gemini, data, max_batches=3)
    run_to_end(fake_gemini, feed, holder)
    # Every line sent exactly once, byte for byte, in one batch per part.
    assert sent_in_order(fake_gemini, holder) == data
    assert len(fake_gemini.batches_created()) == parts
    limits = fake_gemini.limits
    assert len(limits.refusals) <= 2
    assert limits.peak_tokens[MODEL] <= CAP and limits.peak_open <= 3
    assert limits.biggest_upload <= 10**6
    assert len(fake_gemini.files_held()) == parts  # no upload left behind
    # Room is freed when the parts end: nothing enqueued, no slot held.
    assert enqueued(counters, MODEL) == 0 and open_slots(counters) == 0
    assert jobs.summary(holder.read()[1], CAP)["parts"]["ended"] == parts


def test_a_gemini_cap_lower_than_configured_is_learned_and_the_job_finishes(
    fake_gemini: FakeGemini, client: Any, counters: Any
) -> None:
    data = big_input(300)
    # Gemini counts a token per 4 bytes (half opstate's estimate) and caps at a sixth of the
    # configured cap: a part of a whole cap (CAP / 2 of Gemini's tokens) is refused alone.
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP // 6})
    holder = MemoryPlan(plan_for(data))
    feed = feeder(holder, counters, client, fake_gemini, data)
    first = holder.plan["parts"][0]["tokens"]
    feed.step()
    assert len(fake_gemini.limits.refusals) == 1 and fake_gemini.batches_created() == []
    assert holder.read()[1]["learnedCap"] == first // 2  # half the part refused alone
    assert fake_gemini.files_held() == []  # the refused part's upload was deleted
    run_to_end(fake_gemini, feed, holder)
    assert sent_in_order(fake_gemini, holder) == data
    # Each lone refusal halves the cap: CAP -> CAP/2 -> CAP/4 fits under CAP/6 of Gemini's.
    assert len(fake_gemini.limits.refusals) == 2
    assert CAP // 5 <= jobs.summary(holder.read()[1], CAP)["learnedCap"] <= CAP // 4


def test_a_full_queue_holds_the_part_backing_off_one_refusal_per_step(
    fake_gemini: FakeGemini, client: Any, counters: Any
) -> None:
    data = big_input(200)
    # Parts of half the cap by opstate's count (a quarter of it by Gemini's); Gemini takes
    # little more than one: the second part is refused while the first is open.
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP // 4 + 100})
    holder = MemoryPlan(plan_for(data, cap=CAP // 2))
    clock = [1_000 * 10**9]
    feed = feeder(holder, counters, client, fake_gemini, data, clock=clock)
    feed.step()
    assert len(fake_gemini.batches_created()) == 1
    assert len(fake_gemini.limits.refusals) == 1  # one refused create per step and model
    second = holder.read()[1]["parts"][1]
    assert second["phase"] == jobs.HELD and second["refusals"] == 1
    assert second["dueNs"] == clock[0] + 300 * 10**9  # backs off five minutes
    assert "learnedCap" not in holder.read()[1]  # not alone: the queue was full, no lesson
    assert len(fake_gemini.files_held()) == 1  # the refused upload was deleted
    feed.step()  # not due yet: nothing tried
    assert len(fake_gemini.limits.refusals) == 1
    feed.step(every=True)  # an operator's pass tries at once
    assert len(fake_gemini.limits.refusals) == 2
    assert holder.read()[1]["parts"][1]["dueNs"] == clock[0] + 600 * 10**9
    finish_open(fake_gemini)
    feed.step(every=True)
    assert len(fake_gemini.batches_created()) == 2
    assert holder.read()[1]["parts"][1]["phase"] == jobs.CREATED


def test_stop_creates_no_more_parts_and_what_was_created_finishes(
    fake_gemini: FakeGemini, client: Any, counters: Any
) -> None:
    data = big_input()
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    holder = MemoryPlan(plan_for(data))
    feed = feeder(holder, counters, client, fake_gemini, data)
    feed.step()
    assert len(fake_gemini.batches_created()) == 1
    feed.change(lambda plan: jobs.stop(plan, "retry --stop"))
    finish_open(fake_gemini)
    feed.step(every=True)
    _, plan = holder.read()
    assert len(fake_gemini.batches_created()) == 1 and jobs.finished(plan)
    assert jobs.summary(plan, CAP)["stopped"] == "retry --stop"
    assert enqueued(counters, MODEL) == 0


def test_two_runners_at_once_never_create_one_part_twice_and_share_the_count(
    fake_gemini: FakeGemini, client: Any, counters: Any
) -> None:
    data = big_input()
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    holder = MemoryPlan(plan_for(data))
    runners = [feeder(holder, counters, client, fake_gemini, data) for _ in range(2)]
    for _ in range(40):
        threads = [threading.Thread(target=r.step, kwargs={"every": True}) for r in runners]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if jobs.finished(holder.read()[1]):
            break
        finish_open(fake_gemini)
    assert jobs.finished(holder.read()[1])
    assert sent_in_order(fake_gemini, holder) == data
    assert len(fake_gemini.batches_created()) == len(holder.plan["parts"])
    assert fake_gemini.limits.peak_tokens[MODEL] <= CAP


def test_a_runner_dead_mid_create_resubmits_nothing_and_a_forged_batch_is_not_adopted(
    fake_gemini: FakeGemini, client: Any, counters: Any
) -> None:
    data = big_input(100)
    holder = MemoryPlan(plan_for(data))
    clock = [1_000 * 10**9]
    feed = feeder(holder, counters, client, fake_gemini, data, lease_s=60, clock=clock)
    part = holder.plan["parts"][0]
    forged_name = jobs.display_name(holder.plan, part["n"])

    def lose_answer(name: str) -> None:
        raise RuntimeError("the runner died before the answer")

    fake_gemini.on_create(lose_answer)
    feed.step()
    fake_gemini.on_create(None)
    (made,) = fake_gemini.batches_created()
    assert holder.read()[1]["parts"][0]["phase"] == jobs.CREATING
    # Someone else of the project creates a batch under the part's display name.
    other = fake_gemini.put_file("forged-input", body=b'{"key":"x","request":{}}\n')
    fake_gemini.put(
        "batches/forged",
        {
            "name": "batches/forged",
            "metadata": {
                "name": "batches/forged",
                "displayName": forged_name,
                "model": f"models/{MODEL}",
                "inputConfig": {"fileName": other},
                "state": "BATCH_STATE_PENDING",
            },
        },
    )
    clock[0] += 61 * 10**9
    feed.step()
    _, plan = holder.read()
    assert plan["parts"][0]["phase"] == jobs.CREATED
    assert plan["parts"][0]["batch"] == made
    assert made in fake_gemini.batches_created()
    assert fake_gemini.batch_input(made) == data[part["start"] : part["end"]]
