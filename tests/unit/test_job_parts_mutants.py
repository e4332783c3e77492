"""The job queue's pure module's exact bounds and choices (opstate.domain.parts, issue 46),
pinned through its public functions so that ``make mutate`` kills what test_job_parts.py's
properties let through (issue 49): each bound at its edge (a line or a part exactly at a bound
fits), the estimate's floor, the learned correction's guards, the room's order when a model
stops or the open batches run out, and what a job's record shows.

Each test names the mutants of domain/parts.py it kills, by function and mutation
(``tools/mutate.py --module domain.parts --list`` shows where each is). Mutants no input tells apart
are marked beside their line in parts.py (``# mutant: equivalent — why``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from opstate.domain.parts import (
    CREATED,
    CREATING,
    ENDED,
    HELD,
    MAX_HELD_BACKOFF_S,
    Bounds,
    Held,
    PartRange,
    Room,
    SplitError,
    corrected_bytes_per_token,
    held_backoff_s,
    job_finished,
    job_view,
    line_tokens,
    range_tokens,
    recounted,
    room,
    split_hashed,
    split_lines,
)


def caps(**by_model: int) -> Callable[[str], int]:
    return lambda model: by_model[model]


def keys(held: tuple[Held, ...]) -> list[str]:
    return [h.key for h in held]


# --- the estimate -------------------------------------------------------------------------


def test_a_line_is_counted_for_at_least_four_tokens() -> None:
    # MIN_LINE_TOKENS `4 -> 5`. The floor is what a request's role and parts cost
    # beside its text: a short line of 8 bytes is 4 tokens, not 5 (a part's count, and so what
    # is enqueued against Gemini's cap, would rise for every short line).
    assert line_tokens(1) == 4
    assert line_tokens(8) == 4
    assert line_tokens(9) == 5


def test_the_correction_needs_both_bytes_and_a_count() -> None:
    # corrected_bytes_per_token's guard: `or -> and`, `<= -> <` (both), `0 -> 1` (both): with no
    # bytes sent or no tokens counted nothing was learnt (the default; never a division by zero),
    # and a single counted byte is already something learnt (0.75 bytes a token, raised to the floor
    # of 1).
    assert corrected_bytes_per_token(0, 100) == 2.0
    assert corrected_bytes_per_token(100, 0) == 2.0
    assert corrected_bytes_per_token(-1, 100) == 2.0
    assert corrected_bytes_per_token(100, -1) == 2.0
    assert corrected_bytes_per_token(1, 1) == 1.0
    assert corrected_bytes_per_token(400, 100) == 3.0


# --- the values ---------------------------------------------------------------------------


def test_bounds_ranges_parts_and_rooms_are_values_never_changed() -> None:
    # The four dataclasses' `frozen=True -> False`: a PartRange is a plan's record of where
    # a part lies and a Held the room's input; changing one in place would move a part under
    # whoever holds it (and a dataclass that is not frozen is not hashable).
    bounds = Bounds(1, 1, 1)
    part = PartRange(0, 1, 0, 1, 4)
    held = Held("0", "m", 4)
    got = Room((held,), ())
    for value, field in ((bounds, "tokens"), (part, "end"), (held, "tokens"), (got, "fit")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, 2)
        assert hash(value) == hash(dataclasses.replace(value))


def test_bounds_of_one_are_allowed_and_of_zero_refused_with_the_reason() -> None:
    # Bounds's check: `< -> <=`, `1 -> 2`, and its message: a bound of 1 (one row a part) is a
    # real setting; 0 in any of the three is refused, saying why.
    assert Bounds(1, 1, 1).rows == 1
    for tokens, file_bytes, rows in ((0, 1, 1), (1, 0, 1), (1, 1, 0)):
        with pytest.raises(ValueError, match=r"^bounds must be positive: Bounds\(") as info:
            Bounds(tokens, file_bytes, rows)
        assert "XX" not in str(info.value)


def test_a_parts_size_is_its_end_less_its_start() -> None:
    # PartRange.size `- -> +` (a part after the first: start > 0).
    assert PartRange(3, 2, 40, 60, 10).size == 20


# --- the split at each bound's edge ----------------------------------------------------------


def test_a_line_exactly_a_parts_bytes_or_tokens_fits_alone() -> None:
    # split_lines's two checks of a line alone, `> -> >=`: a line may fill a part's bytes, or its
    # tokens, to the last one; only a line over a bound is an error.
    line = b"x" * 99 + b"\n"  # 100 bytes, 50 tokens
    assert list(split_lines([line], Bounds(tokens=1_000, file_bytes=100, rows=5))) == [
        PartRange(0, 1, 0, 100, 50)
    ]
    assert list(split_lines([line], Bounds(tokens=50, file_bytes=1_000, rows=5))) == [
        PartRange(0, 1, 0, 100, 50)
    ]


def test_a_split_error_says_the_whole_reason() -> None:
    # split_lines's messages: the operator reads which line, how big, and the bound.
    with pytest.raises(SplitError) as info:
        list(split_lines([b"d" * 501 + b"\n"], Bounds(tokens=100, file_bytes=10_000, rows=10)))
    assert str(info.value) == "line 1: about 251 tokens, over the 100 a part may hold"
    with pytest.raises(SplitError) as info:
        list(split_lines([b"ok\n", b"e" * 20 + b"\n"], Bounds(tokens=100, file_bytes=10, rows=9)))
    assert str(info.value) == "line 2: 21 bytes, over a part's 10"
    assert info.value.line == 2


@pytest.mark.parametrize(
    ("bounds", "expected"),
    [
        # rows: exactly 3 rows fill a part (split_lines: `rows + 1 > ...`: `> -> >=`, `1 -> 2`).
        (Bounds(tokens=1_000, file_bytes=1_000, rows=3), [(0, 3, 0, 30, 15), (3, 3, 30, 60, 15)]),
        # bytes: 30 bytes fill a part exactly (`size + length > ...`: `> -> >=`).
        (Bounds(tokens=1_000, file_bytes=30, rows=100), [(0, 3, 0, 30, 15), (3, 3, 30, 60, 15)]),
        # tokens: 15 tokens fill a part exactly (`tokens + cost > ...`: `> -> >=`).
        (Bounds(tokens=15, file_bytes=1_000, rows=100), [(0, 3, 0, 30, 15), (3, 3, 30, 60, 15)]),
    ],
)
def test_a_part_filled_to_a_bound_exactly_is_not_cut_short(
    bounds: Bounds, expected: list[tuple[int, ...]]
) -> None:
    # Six lines of 10 bytes (5 tokens): two full parts, not three or more smaller ones (each
    # part is a batch Gemini queues and a create opstate pays a round trip for).
    lines = [b"x" * 9 + b"\n"] * 6
    assert [
        (p.first, p.rows, p.start, p.end, p.tokens) for p in split_lines(lines, bounds)
    ] == expected


def test_a_hashed_split_placed_in_a_larger_input_hashes_each_parts_bytes() -> None:
    # split_hashed's defaults `0 -> 1` and its held-back line (`if last`, `==`, `and`): each part's
    # digest is of its own lines, the line that closed it counted in the next part.
    import hashlib

    lines = [b"a" * 9 + b"\n", b"b" * 9 + b"\n", b"c" * 9 + b"\n"]
    got = list(split_hashed(lines, Bounds(tokens=10, file_bytes=100, rows=9), first=7, start=70))
    assert [(p.first, p.rows, p.start, p.end) for p in got] == [(7, 2, 70, 90), (9, 1, 90, 100)]
    assert [p.sha256 for p in got] == [
        hashlib.sha256(lines[0] + lines[1]).hexdigest(),
        hashlib.sha256(lines[2]).hexdigest(),
    ]
    alone = list(split_hashed(lines[:1], Bounds(tokens=10, file_bytes=100, rows=9)))
    assert [(p.first, p.start, p.sha256) for p in alone] == [
        (0, 0, hashlib.sha256(lines[0]).hexdigest())
    ]


# --- the room ------------------------------------------------------------------------------


def test_a_part_exactly_at_its_models_cap_fits() -> None:
    # room: `part.tokens > limit` `> -> >=` (alone, it is not too big); `used.get(m, 0) +
    # part.tokens > limit` `> -> >=` and `0 -> 1` (beside nothing enqueued, it fits): a cap is what
    # may be enqueued, inclusive.
    got = room([Held("p", "m", 100)], {}, caps(m=100), open_batches=0, max_batches=5)
    assert (keys(got.fit), got.too_big) == (["p"], ())


def test_parts_summing_exactly_to_the_cap_both_fit() -> None:
    # room: `used[m] = used.get(m, 0) + ...` `0 -> 1`: what this pass fed is counted exactly,
    # so the part that brings a model to its cap exactly is fed too.
    got = room(
        [Held("p1", "m", 60), Held("p2", "m", 40)], {}, caps(m=100), open_batches=0, max_batches=5
    )
    assert keys(got.fit) == ["p1", "p2"]
    got = room([Held("p1", "m", 60)], {"m": 40}, caps(m=100), open_batches=0, max_batches=5)
    assert keys(got.fit) == ["p1"]


def test_a_part_too_big_for_its_model_does_not_stop_another_model() -> None:
    # room: the `continue` after a part too big, `-> break`: a part to split stops its own model (a
    # later part of it never overtakes), not the parts of another model behind it.
    held = [Held("big", "n", 11), Held("n2", "n", 1), Held("m1", "m", 5)]
    got = room(held, {}, caps(m=100, n=10), open_batches=0, max_batches=5)
    assert (keys(got.fit), keys(got.too_big)) == (["m1"], ["big"])


def test_once_the_open_batches_are_all_used_the_pass_looks_no_further() -> None:
    # room: the `break` when the slots are used, `-> continue`: with every batch slot taken, the
    # pass stops where it is: a part behind, even one too big for its model, is left for a pass that
    # can create (feeding splits a too-big part only when a pass reaches it; with no slot left,
    # splitting now would write a plan the pass cannot act on).
    held = [Held("p1", "m", 10), Held("p2", "m", 10), Held("big", "n", 11)]
    got = room(held, {}, caps(m=100, n=10), open_batches=8, max_batches=9)
    assert (keys(got.fit), got.too_big) == (["p1"], ())


# --- what a job's record shows -------------------------------------------------------------


def plan_of(*phases: str, **extra: Any) -> dict[str, Any]:
    parts = [{"n": i, "phase": p, "rows": 2, "tokens": 10} for i, p in enumerate(phases)]
    return {"model": "m", "parts": parts, **extra}


def test_a_stopped_job_with_only_held_and_ended_parts_is_finished() -> None:
    # job_finished: `if stopped -> if not stopped`: after ``retry --stop`` a held part will
    # never be created, so a job whose created parts have ended has nothing left to wait for.
    assert job_finished(plan_of(HELD, ENDED, stopped=True))
    assert not job_finished(plan_of(HELD, ENDED))
    assert not job_finished(plan_of(CREATING, ENDED, stopped=True))
    assert job_view(plan_of(HELD, ENDED, stopped=True))["waitingFor"] == "nothing"


def test_the_record_shows_the_cap_the_job_was_submitted_with() -> None:
    # job_view: `cap is None -> is not None`: with no cap given, the one kept in the plan's
    # limits is shown; a cap given (the configured one) wins over it.
    assert job_view(plan_of(HELD, limits={"cap": 700}))["cap"] == 700
    assert job_view(plan_of(HELD, limits={"cap": 700}), 900)["cap"] == 900
    assert job_view(plan_of(HELD, limits={"cap": "700"}))["cap"] is None
    assert job_view(plan_of(HELD))["cap"] is None


def test_the_record_shows_a_taught_cap_below_the_known_one() -> None:
    # job_view's learned cap (its `if`, `and -> or`, `> -> >=`, `0 -> 1`, `is not -> is`) and its
    # `if isinstance(learned, int)`: a cap Gemini taught lowers the shown cap, however low (1 is a
    # cap); 0 is no cap taught; with no cap known the taught one is shown beside it, never compared
    # with None.
    view = job_view(plan_of(HELD, learnedCap=50), 100)
    assert (view["cap"], view["learnedCap"]) == (50, 50)
    assert job_view(plan_of(HELD, learnedCap=1), 100)["cap"] == 1
    assert job_view(plan_of(HELD, learnedCap=500), 100)["cap"] == 100
    view = job_view(plan_of(HELD, learnedCap=0), 100)
    assert (view["cap"], view["learnedCap"]) == (100, 0)
    view = job_view(plan_of(HELD, learnedCap=50))
    assert (view["cap"], view["learnedCap"]) == (None, 50)
    view = job_view(plan_of(HELD, learnedCap="50"), 100)
    assert view["cap"] == 100 and "learnedCap" not in view
    assert "learnedCap" not in job_view(plan_of(HELD), 100)


def test_the_record_says_why_a_job_stopped_only_when_it_did() -> None:
    # job_view's `if plan.get("stopped")`.
    assert "stopped" not in job_view(plan_of(HELD))
    assert job_view(plan_of(HELD, stopped=True, stoppedWhy="budget"))["stopped"] == "budget"
    assert job_view(plan_of(HELD, stopped=True))["stopped"] == "stopped"


def test_the_record_says_what_a_job_waits_for() -> None:
    # job_view's waitingFor (its `if`s, `and -> or`, `not x -> x`): held parts of a running job
    # wait for room; a stopped job's held parts never will, so it waits for its created parts;
    # a running job with nothing held waits for its created parts too.
    assert job_view(plan_of(HELD, CREATED))["waitingFor"] == "room in the model's queue"
    assert job_view(plan_of(HELD, CREATED, stopped=True))["waitingFor"] == "created parts to end"
    assert job_view(plan_of(CREATED, ENDED))["waitingFor"] == "created parts to end"
    assert job_view(plan_of(ENDED, ENDED))["waitingFor"] == "nothing"


def test_the_record_counts_a_part_without_rows_or_tokens_as_none() -> None:
    # job_view's defaults `0 -> 1`: a phase with no part is 0, and a part whose
    # entry lacks rows or tokens adds none (the record is read, never trusted to be whole).
    view = job_view({"model": "m", "parts": [{"phase": CREATED}, {"phase": HELD, "rows": 3}]})
    assert view["parts"] == {HELD: 1, CREATING: 0, CREATED: 1, ENDED: 0}
    assert (view["rows"], view["enqueuedTokens"]) == (3, 0)


def test_a_backoff_caps_however_many_refusals() -> None:
    # held_backoff_s: `refusals - 1 -> + 1` and `1 -> 2` (the first refusal waits the base,
    # the fourth and after the cap), and a count far past any float's power (its bound of 16).
    assert held_backoff_s(1) == 300.0
    assert held_backoff_s(3) == 1200.0
    assert held_backoff_s(4) == MAX_HELD_BACKOFF_S
    assert held_backoff_s(10_000) == MAX_HELD_BACKOFF_S


def test_range_tokens_exact_values() -> None:
    # range_tokens: its floor (max's MIN_LINE_TOKENS), the rounding up, the 4 a row.
    assert range_tokens(0, 0) == 4
    assert range_tokens(2, 0) == 4
    assert range_tokens(10, 0) == 5
    assert range_tokens(11, 0) == 6
    assert range_tokens(11, 2) == 14
    assert range_tokens(12, 3, 4.0) == 15


def test_a_part_recounted_at_a_rate_of_fewer_tokens_a_byte_never_counts_more() -> None:
    # recounted: `>= -> >`/`<`, the `if` negated: at a rate that counts fewer tokens a byte (the
    # same rate included) a part keeps the lower of what it had and the range bound; at a rate
    # that counts more it takes the bound.
    assert recounted(100, 300, 10, 2.0, 3.0) == 100  # bound 140
    assert recounted(100, 120, 5, 2.0, 3.0) == 60  # bound 40 + 20
    assert recounted(100, 120, 5, 2.0, 2.0) == 80  # bound 60 + 20, the same rate
    assert recounted(50, 120, 5, 2.0, 2.0) == 50  # the same rate: never more than it had
    assert recounted(100, 300, 10, 3.0, 2.0) == 190  # bound 150 + 40, more tokens a byte


def test_the_record_shows_the_estimate_corrected_from_usage() -> None:
    # job_view's `if isinstance(estimate, Mapping)`.
    estimate = {"bytesPerToken": 3.5, "sentBytes": 700, "promptTokens": 150, "other": 1}
    view = job_view(plan_of(HELD, estimate=estimate))
    assert view["estimate"] == {"bytesPerToken": 3.5, "sentBytes": 700, "promptTokens": 150}
    assert "estimate" not in job_view(plan_of(HELD))
    assert "estimate" not in job_view(plan_of(HELD, estimate=3.5))
