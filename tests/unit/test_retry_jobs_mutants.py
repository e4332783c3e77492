"""A job's parts plan's exact steps (opstate.retry.jobs, issue 46), pinned so that ``make mutate``
kills what test_job_parts.py's plan walk lets through (issue 49): a new part's counters, which
held parts a pass may try, a release's backoff, the cap a refusal teaches, a split's bounds,
a stop, and the words of each refusal.

Each test names the mutants of retry/jobs.py it kills, by function and mutation
(``tools/mutate.py --module retry.jobs --list`` shows where each is).
"""

from __future__ import annotations

from typing import Any

import pytest

from opstate.domain.parts import HELD_BACKOFF_S, PartRange
from opstate.retry import jobs

SECOND_NS = 1_000_000_000


def plan_of(count: int = 2) -> dict[str, Any]:
    # Parts of 4 lines, 20 bytes, 10 tokens each.
    ranges = [PartRange(4 * i, 4, 20 * i, 20 * (i + 1), 10) for i in range(count)]
    return jobs.new_plan("abc", "m", {"bytes": 20 * count}, ranges)


def refuses(call: Any, message: str) -> None:
    """``call()`` raises PlanError with exactly ``message`` (what the operator reads)."""
    with pytest.raises(jobs.PlanError) as info:
        call()
    assert str(info.value) == message


def test_a_job_id_is_24_hex_digits() -> None:
    # new_job_id: `token_hex(12) -> token_hex(13)`: the id is in every display name Gemini
    # shows and in the job's name (``jobs/<id>``), documented as 24 digits.
    job_id = jobs.new_job_id()
    assert len(job_id) == 24 and int(job_id, 16) >= 0


def test_a_new_part_is_held_due_at_once_with_no_refusal_counted() -> None:
    # _entry's `refusals: 0` and `dueNs: 0`, `0 -> 1`: a new part has been refused no times (its
    # first refusal waits the base backoff, not double) and is due at once, even at a clock's 0.
    plan = plan_of()
    assert [(p["refusals"], p["dueNs"]) for p in plan["parts"]] == [(0, 0), (0, 0)]
    assert [h.key for h in jobs.waiting(plan, 0)] == ["0", "1"]
    jobs.claim(plan, 0, 5)
    jobs.released(plan, 0, 1_000, refused=True)
    assert jobs.part_of(plan, 0)["dueNs"] == 1_000 + int(HELD_BACKOFF_S * SECOND_NS)


def test_a_plan_refuses_more_parts_than_its_bound_and_an_empty_input_in_words() -> None:
    # new_plan's messages.
    many = [PartRange(i, 1, i, i + 1, 4) for i in range(jobs.MAX_PARTS + 1)]
    refuses(
        lambda: jobs.new_plan("abc", "m", {}, many),
        "the input needs more than 400 parts; raise the model's OPSTATE_SUBMIT_ENQUEUED_TOKENS "
        "if the tier allows, or submit it in pieces",
    )
    assert len(jobs.new_plan("abc", "m", {}, many[:-1])["parts"]) == jobs.MAX_PARTS
    refuses(lambda: jobs.new_plan("abc", "m", {}, []), "an empty input has nothing to submit")


def test_a_part_not_in_the_plan_is_refused_by_number() -> None:
    # part_of's message.
    refuses(lambda: jobs.part_of(plan_of(), 7), "the plan has no part 7")


def test_the_cap_fed_under_is_lowered_by_a_taught_cap_only() -> None:
    # cap_of (`and -> or`, `> -> >=`, `0 -> 1`): no cap taught, the configured one; a
    # taught cap lowers it (1 is a cap), never raises it; 0 or a non-number is none taught.
    plan = plan_of()
    assert jobs.cap_of(plan, 100) == 100
    for learned, cap in ((50, 50), (1, 1), (500, 100), (0, 100), ("50", 100)):
        assert jobs.cap_of(plan | {"learnedCap": learned}, 100) == cap


def test_a_pass_tries_held_parts_in_order_past_created_ones_up_to_one_backing_off() -> None:
    # waiting: its `continue`, `-> break`: a part already created is passed over, not a stop.
    # waiting: `dueNs > now_ns`, `> -> >=`: a part is due at its due time exactly.
    # waiting: `every=False -> True`: a backing-off part holds back those after it unless
    # an operator's pass asks for every part.
    plan = plan_of(3)
    jobs.claim(plan, 0, 5)
    jobs.created(plan, 0, "batches/b0")
    assert [h.key for h in jobs.waiting(plan, 0)] == ["1", "2"]
    jobs.claim(plan, 1, 5)
    jobs.released(plan, 1, 1_000, refused=True)
    due = 1_000 + int(HELD_BACKOFF_S * SECOND_NS)
    assert jobs.waiting(plan, due - 1) == []
    assert [h.key for h in jobs.waiting(plan, due)] == ["1", "2"]
    assert [(h.key, h.model, h.tokens) for h in jobs.waiting(plan, 0, every=True)] == [
        ("1", "m", 10),
        ("2", "m", 10),
    ]


def test_a_part_with_no_due_time_or_count_is_due_at_once_and_counted_from_nothing() -> None:
    # waiting's `get("dueNs", 0)` and released's `get("refusals", 0)`, `0 -> 1`: the plan is
    # read from the store, never trusted to be whole: a part lacking its due time is due at
    # once, one lacking its refusal count has none.
    plan = plan_of(1)
    for key in ("dueNs", "refusals"):
        del plan["parts"][0][key]
    assert [h.key for h in jobs.waiting(plan, 0)] == ["0"]
    jobs.claim(plan, 0, 5)
    jobs.released(plan, 0, 1_000, refused=True)
    assert jobs.part_of(plan, 0)["refusals"] == 1


def test_a_release_backs_off_only_a_refused_part_counting_each_refusal_once() -> None:
    # released: the count (`+ -> -`, `1 -> 2`, `else 0 -> 1`), the wait (`else 0 -> 1`),
    # the due time (`+ -> -`): a
    # refused create counts one refusal and waits the backoff from now (doubling on the next);
    # a claim that came to nothing counts none and is due now.
    plan = plan_of(1)
    jobs.claim(plan, 0, 5)
    jobs.uploaded(plan, 0, "files/f0")
    jobs.released(plan, 0, 1_000, refused=False)
    part = jobs.part_of(plan, 0)
    assert (part["phase"], part["refusals"], part["dueNs"]) == (jobs.HELD, 0, 1_000)
    assert "file" not in part and "leaseNs" not in part
    for count, wait_s in ((1, HELD_BACKOFF_S), (2, 2 * HELD_BACKOFF_S)):
        jobs.claim(plan, 0, 5)
        jobs.released(plan, 0, 7_000, refused=True)
        assert (part["refusals"], part["dueNs"]) == (count, 7_000 + int(wait_s * SECOND_NS))


def test_a_created_part_starts_its_refusal_count_afresh() -> None:
    # created: `refusals=0 -> 1`: the count is of refusals in a row; a create that went
    # through ends the row (the record shows a created part refused no more).
    plan = plan_of(1)
    jobs.claim(plan, 0, 5)
    jobs.released(plan, 0, 0, refused=True)
    jobs.claim(plan, 0, 5)
    jobs.created(plan, 0, "batches/b0")
    part = jobs.part_of(plan, 0)
    assert (part["phase"], part["batch"], part["refusals"]) == (jobs.CREATED, "batches/b0", 0)
    assert "leaseNs" not in part


def test_claiming_or_splitting_a_part_not_held_is_refused_saying_its_phase() -> None:
    # claim's and split's messages (the phase is read from the part).
    plan = plan_of()
    jobs.claim(plan, 0, 5)
    refuses(lambda: jobs.claim(plan, 0, 5), "part 0 is creating, not held")
    refuses(
        lambda: jobs.split(plan, 0, [PartRange(0, 4, 0, 20, 10)]),
        "part 0 is creating: only a held part is split",
    )


def test_a_split_must_cover_its_part_exactly() -> None:
    # split's cover check (`or -> and`, `not x -> x`, each `!= -> ==`, `[0]`, `[-1]`)
    # and its message: no pieces, a wrong start, a wrong end or a wrong row count is refused,
    # in words; the exact cover is taken.
    plan = plan_of()
    wrong: tuple[list[PartRange], ...] = (
        [],
        [PartRange(0, 2, 1, 10, 5), PartRange(2, 2, 10, 20, 5)],
        [PartRange(0, 2, 0, 10, 5), PartRange(2, 2, 10, 19, 5)],
        [PartRange(0, 2, 0, 10, 5), PartRange(2, 3, 10, 20, 5)],
    )
    for pieces in wrong:
        with pytest.raises(jobs.PlanError) as info:
            jobs.split(plan, 0, pieces)
        assert str(info.value) == "the pieces do not cover part 0"
    jobs.split(plan, 0, [PartRange(0, 2, 0, 10, 5), PartRange(2, 2, 10, 20, 5)])
    assert [p["n"] for p in plan["parts"]] == [2, 3, 1]


def test_a_split_may_bring_a_plan_to_its_parts_bound_but_not_past_it() -> None:
    # split's bound (its `if`, `> -> >=`, `- -> +`, `+ -> -`, `1 -> 2`) and its message:
    # the part split is replaced, so 399 parts and a part split in 2 is 400, allowed; in 3 is
    # 401, refused.
    two = [PartRange(0, 2, 0, 10, 5), PartRange(2, 2, 10, 20, 5)]
    three = [PartRange(0, 1, 0, 5, 3), PartRange(1, 1, 5, 10, 3), PartRange(2, 2, 10, 20, 5)]
    plan = plan_of(jobs.MAX_PARTS - 1)
    refuses(lambda: jobs.split(plan, 0, three), "splitting part 0 would pass 400 parts")
    assert len(plan["parts"]) == jobs.MAX_PARTS - 1
    jobs.split(plan, 0, two)
    assert len(plan["parts"]) == jobs.MAX_PARTS


def test_a_taught_cap_is_kept_lowest() -> None:
    # learn (`and -> or`, `> -> >=`, `0 -> 1`): the first cap taught is kept, a lower
    # one replaces it, a higher one never; 0 kept before is no cap, 1 is a cap.
    plan = plan_of()
    jobs.learn(plan, 500)
    assert plan["learnedCap"] == 500
    jobs.learn(plan, 900)
    assert plan["learnedCap"] == 500
    jobs.learn(plan, 200)
    assert plan["learnedCap"] == 200
    assert jobs.cap_of(plan, 1_000) == 200
    plan["learnedCap"] = 0
    jobs.learn(plan, 300)
    assert plan["learnedCap"] == 300
    plan["learnedCap"] = 1
    jobs.learn(plan, 300)
    assert plan["learnedCap"] == 1


def test_a_stopped_job_tries_nothing_and_is_finished_once_nothing_is_open() -> None:
    # stop's `True -> False` and waiting's `if plan.get("stopped")`: after a stop no held part is
    # tried, even by an operator's pass, and the job is done when its open parts have ended;
    # the first reason given is kept.
    plan = plan_of(3)
    jobs.claim(plan, 0, 5)
    jobs.created(plan, 0, "batches/b0")
    jobs.stop(plan, "budget")
    jobs.stop(plan, "retry --stop")
    assert plan["stopped"] is True and plan["stoppedWhy"] == "budget"
    assert jobs.waiting(plan, 0, every=True) == []
    assert not jobs.finished(plan)
    jobs.ended(plan, 0)
    assert jobs.finished(plan)
    assert jobs.summary(plan)["stopped"] == "budget"
