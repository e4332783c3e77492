"""A cap learned from a refusal is shared per model (issue 46; docs/jobs.md, "A learned cap"):
kept in the store's counters beside the enqueued count (``opstate.retry.room``), so that the
next job of the model starts from it (split under it, shown as ``learnedCap``), a running job
of the model feeds under it from its next step, a configured cap below it wins, and an
operator's ``opstate retry --forget-cap MODEL`` forgets it; and a retry batch's reservation
(``opstate.retry.child_room``) shares the count with a job's parts. On SQLite and on DynamoDB
(moto), against the fake Gemini enforcing a cap lower than configured."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from opstate.config import Settings, SubmitSettings
from opstate.domain.retry import RetryPolicy
from opstate.outcomes.wiring import sink_from_url
from opstate.retry import child_room, jobs, room
from opstate.retry.job_submit import submit_job
from opstate.retry.room import enqueued, open_slots
from opstate.retry.wiring import config_from
from tests.integration.test_job_feeding import (
    CAP,
    MODEL,
    MemoryPlan,
    big_input,
    client,
    counters,
    feeder,
    plan_for,
    run_to_end,
)
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits

__all__ = ["client", "counters"]  # the fixtures


def submitted(store: Any, tmp_path: Path, data: bytes, cap: int = CAP, shown: str = "") -> Any:
    sink = sink_from_url((tmp_path / "results").as_uri(), Settings())
    job = submit_job(
        store,
        sink,
        lambda: iter([data]),
        model=MODEL,
        policy=RetryPolicy(),
        limits=SubmitSettings(submit_enqueued_tokens=((MODEL, cap),)),
        display_name=shown,
    )
    assert job is not None
    state = store.get_retry(job.name)
    return state.doc["job"]


def test_a_second_job_of_the_model_starts_from_the_cap_the_first_learned(
    fake_gemini: FakeGemini, client: Any, counters: Any, tmp_path: Path
) -> None:
    data = big_input(300)
    # Gemini counts a token per 4 bytes and caps at a sixth of the configured cap: the first
    # job's lone parts are refused twice, the cap halved each time (test_job_feeding's lesson).
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP // 6})
    holder = MemoryPlan(plan_for(data))
    assert room.learned(counters, MODEL) is None
    run_to_end(fake_gemini, feeder(holder, counters, client, fake_gemini, data), holder)
    assert len(fake_gemini.limits.refusals) == 2
    taught = holder.read()[1]["learnedCap"]
    assert taught < CAP and room.learned(counters, MODEL) == taught
    assert room.learned(counters, f"models/{MODEL.upper()}") == taught  # one model, any spelling
    # The next job of the model: split under the learned cap, shown on its record.
    plan = submitted(counters, tmp_path, data)
    assert plan["learnedCap"] == taught
    assert max(p["tokens"] for p in plan["parts"]) <= taught < CAP
    assert jobs.summary(plan)["learnedCap"] == taught and jobs.summary(plan)["cap"] == taught
    # It feeds without a refusal of its own: Gemini's lesson was learned once.
    refused, created = len(fake_gemini.limits.refusals), len(fake_gemini.batches_created())
    second = MemoryPlan(plan)
    feeder(second, counters, client, fake_gemini, data).step()
    assert len(fake_gemini.limits.refusals) == refused
    assert len(fake_gemini.batches_created()) > created
    # A lower lesson lowers it; a higher one never raises it.
    room.learn(counters, MODEL, taught // 2)
    room.learn(counters, MODEL, taught)
    assert room.learned(counters, MODEL) == taught // 2
    # A configured cap below the learned one wins: nothing learned is written in the plan.
    lower = submitted(counters, tmp_path, data, cap=taught // 4, shown="lower")
    assert "learnedCap" not in lower
    assert max(p["tokens"] for p in lower["parts"]) <= taught // 4
    # The operator forgets it: the next job starts from the setting again.
    assert room.forget(counters, MODEL) == taught // 2
    assert room.learned(counters, MODEL) is None
    fresh = submitted(counters, tmp_path, data, shown="fresh")
    assert "learnedCap" not in fresh and jobs.summary(fresh)["cap"] == CAP
    # And learning starts over after a forget.
    room.learn(counters, MODEL, CAP - 1)
    assert room.learned(counters, MODEL) == CAP - 1


def test_a_retry_childs_reservation_and_a_jobs_parts_share_one_count(
    fake_gemini: FakeGemini, client: Any, counters: Any
) -> None:
    # opstate.retry.child_room on the store's own counters (SQLite, DynamoDB): a child's
    # reservation is room a part cannot take, and the other way round; the open-batch bound
    # counts both.
    config = replace(config_from(Settings()), submit_caps=((MODEL, CAP),), submit_max_batches=2)
    runner: Any = SimpleNamespace(store=counters, config=config, sink=None)
    child = {"model": f"models/{MODEL}", "bytes": CAP, "rows": 10, "input": "unused"}
    held = child_room.hold(runner, child)
    assert held is not None and held.new
    assert held.doc == {"model": MODEL, "tokens": CAP // 2 + 40}
    assert (enqueued(counters, MODEL), open_slots(counters)) == (CAP // 2 + 40, 1)
    assert child_room.hold(runner, {**child, "reserved": held.doc}) == child_room.Held(
        held.doc, False
    )  # recorded by an earlier claim: used again, nothing more taken
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    data = big_input(600)
    holder = MemoryPlan(plan_for(data))
    feed = feeder(holder, counters, client, fake_gemini, data, max_batches=2)
    feed.step()
    assert fake_gemini.batches_created() == [] and fake_gemini.limits.refusals == []
    assert child_room.hold(runner, child) is None  # a second child: over the cap
    child_room.give_back(runner, [held.doc])  # the child's batch ended
    feed.step()
    assert len(fake_gemini.batches_created()) == 1
    assert child_room.hold(runner, child) is None  # the part holds the room now
    small = {**child, "bytes": 100, "rows": 1, "model": "gemini-2.5-pro"}
    other = child_room.hold(runner, small)  # another model's queue: room, a slot
    assert other is not None and open_slots(counters) == 2
    assert child_room.hold(runner, {**small, "model": "gemini-2.0-flash"}) is None  # no slot
    assert enqueued(counters, "gemini-2.0-flash") == 0  # refused whole: nothing kept


class RecountedOnReserve:
    """Counters that let another runner recount the first held part (a corrected rate)
    right after this runner reserved its tokens, before its claim is written."""

    def __init__(self, inner: Any, holder: MemoryPlan) -> None:
        self.inner, self.holder, self.done = inner, holder, False

    def get_counter(self, counter: str) -> int:
        return int(self.inner.get_counter(counter))

    def add_counter(self, counter: str, amount: int, cap: int) -> bool:
        added = bool(self.inner.add_counter(counter, amount, cap))
        if added and counter.endswith(":reserved") and "enqueued" in counter and not self.done:
            self.done = True
            with self.holder.lock:
                self.holder.plan["parts"][0]["tokens"] -= 10
                self.holder.rev += 1
        return added


def test_a_part_recounted_between_its_reservation_and_its_claim_is_not_claimed(
    fake_gemini: FakeGemini, client: Any, counters: Any
) -> None:
    # The claim checks the part still has the tokens reserved for it: otherwise it would be
    # freed at its end for another count than it took.
    data = big_input(300)
    holder = MemoryPlan(plan_for(data))
    first = holder.plan["parts"][0]["tokens"]
    racing = RecountedOnReserve(counters, holder)
    feeder(holder, racing, client, fake_gemini, data).step()
    assert fake_gemini.batches_created() == []
    assert holder.read()[1]["parts"][0]["phase"] == "held"
    assert (enqueued(counters, MODEL), open_slots(counters)) == (0, 0)  # given back
    feeder(holder, racing, client, fake_gemini, data).step()
    assert len(fake_gemini.batches_created()) == 1
    assert enqueued(counters, MODEL) == first - 10 == holder.read()[1]["parts"][0]["tokens"]
