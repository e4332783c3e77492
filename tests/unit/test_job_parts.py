"""One job of any size, the pure part (opstate.domain.parts, issue 46): the token estimate, the
streamed split at line boundaries, the room a feeding pass has, and what a refusal teaches."""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opstate.domain.parts import (
    BYTES_PER_TOKEN,
    HELD_BACKOFF_S,
    MAX_HELD_BACKOFF_S,
    MIN_LINE_TOKENS,
    Bounds,
    Held,
    PartRange,
    SplitError,
    corrected_bytes_per_token,
    held_backoff_s,
    learned_cap,
    line_tokens,
    range_tokens,
    room,
    split_lines,
)

LINE = st.binary(min_size=0, max_size=300).map(lambda b: b.replace(b"\n", b"x") + b"\n")
BOUNDS = st.builds(
    Bounds,
    tokens=st.integers(160, 2_000),
    file_bytes=st.integers(310, 5_000),
    rows=st.integers(1, 40),
)


def request_line(key: str, text: str) -> bytes:
    row = {"key": key, "request": {"contents": [{"role": "user", "parts": [{"text": text}]}]}}
    return json.dumps(row, ensure_ascii=False).encode() + b"\n"


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(LINE, max_size=120), bounds=BOUNDS, last_newline=st.booleans())
def test_parts_cover_the_input_once_in_order_each_under_every_bound(
    lines: list[bytes], bounds: Bounds, last_newline: bool
) -> None:
    if lines and not last_newline:
        lines[-1] = lines[-1][:-1]  # a file whose last line has no newline
    data = b"".join(lines)
    parts = list(split_lines(io.BytesIO(data), bounds))
    # Contiguous, in order, every line and every byte exactly once.
    assert sum(p.rows for p in parts) == len([line for line in lines if line]) or data == b""
    assert b"".join(data[p.start : p.end] for p in parts) == data
    position, line = 0, 0
    for part in parts:
        assert (part.start, part.first) == (position, line)
        assert part.rows >= 1
        assert part.rows <= bounds.rows
        assert part.size <= bounds.file_bytes
        assert part.tokens <= bounds.tokens
        chunk = io.BytesIO(data[part.start : part.end]).readlines()
        assert len(chunk) == part.rows
        assert part.tokens == sum(line_tokens(len(c)) for c in chunk)
        position, line = part.end, line + part.rows
    assert position == len(data)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(LINE, min_size=2, max_size=80), bounds=BOUNDS)
def test_a_part_closes_only_when_its_next_line_would_break_a_bound(
    lines: list[bytes], bounds: Bounds
) -> None:
    # Not a trivially small cut: each part but the last is full (the next line would not fit).
    data = b"".join(lines)
    parts = list(split_lines(io.BytesIO(data), bounds))
    for part, after in itertools.pairwise(parts):
        following = io.BytesIO(data[after.start : after.end]).readline()
        assert (
            part.rows + 1 > bounds.rows
            or part.size + len(following) > bounds.file_bytes
            or part.tokens + line_tokens(len(following)) > bounds.tokens
        )


def test_a_line_over_a_bound_is_an_error_naming_it_before_any_part() -> None:
    lines = [b"a" * 10 + b"\n", b"b" * 10 + b"\n", b"c" * 500 + b"\n"]
    produced: list[PartRange] = []
    with pytest.raises(SplitError, match="line 3: 501 bytes, over a part's 400") as info:
        # list(): the generator must fail before its caller acts on the first parts.
        produced = list(split_lines(lines, Bounds(tokens=10_000, file_bytes=400, rows=10)))
    assert info.value.line == 3
    assert produced == []
    with pytest.raises(SplitError, match="line 1: about 251 tokens, over the 100"):
        list(split_lines([b"d" * 501 + b"\n"], Bounds(tokens=100, file_bytes=10_000, rows=10)))


def test_split_again_places_the_parts_in_the_larger_input() -> None:
    lines = [b"x" * 9 + b"\n"] * 6  # 10 bytes = 5 tokens each
    parts = list(split_lines(lines, Bounds(tokens=10, file_bytes=100, rows=100), first=4, start=40))
    assert parts == [
        PartRange(4, 2, 40, 60, 10),
        PartRange(6, 2, 60, 80, 10),
        PartRange(8, 2, 80, 100, 10),
    ]


def test_the_estimate_is_half_the_bytes_with_a_floor() -> None:
    assert BYTES_PER_TOKEN == 2
    assert line_tokens(0) == MIN_LINE_TOKENS
    assert line_tokens(101) == 51
    assert line_tokens(101, 4.0) == 26


@pytest.mark.parametrize(
    "text",
    [
        "Summarise the following paragraph in one sentence: the quick brown fox jumps over it.",
        "次の文章を一文で要約してください。吾輩は猫である。名前はまだ無い。",
        "请用一句话总结下面这段话。今天天气很好。我们去公园散步。",
        "다음 문단을 한 문장으로 요약하세요. 오늘은 날씨가 좋습니다.",
    ],
)
def test_the_estimate_is_above_one_token_per_character_for_english_and_cjk(text: str) -> None:
    # A token stands for at least one character in Gemini's tokenizer (pieces, never less than
    # a character, save byte fallback): a line counted at or above its characters' number is
    # at or above Gemini's count of its text.
    line = request_line("k1", text)
    assert line_tokens(len(line)) >= len(text)


def test_the_correction_learns_from_counted_parts_within_bounds() -> None:
    assert corrected_bytes_per_token(0, 0) == BYTES_PER_TOKEN
    assert corrected_bytes_per_token(4_000, 1_000) == 3.0  # 4 bytes a token, less a quarter
    assert corrected_bytes_per_token(1_000, 5_000) == 1.0  # never below a byte a token
    assert corrected_bytes_per_token(10**9, 1) == 4 * BYTES_PER_TOKEN


@given(
    st.lists(LINE, max_size=40),
    st.sampled_from([1.0, 1.5, float(BYTES_PER_TOKEN), 3.0, 8.0]),
)
def test_a_range_is_counted_at_or_above_its_lines_and_within_four_a_line(
    lines: list[bytes], rate: float
) -> None:
    # A retry batch's input and a held part recounted at a corrected rate are known by their
    # bytes and rows only: the count must never be below what line_tokens counts line by line.
    size, rows = sum(map(len, lines)), len(lines)
    by_line = sum(line_tokens(len(line), rate) for line in lines)
    assert by_line <= range_tokens(size, rows, rate) <= max(4, by_line + 4 * rows + 1)


def cap_of(caps: dict[str, int]) -> Callable[[str], int]:
    return lambda model: caps[model]


def test_room_feeds_in_input_order_and_never_overtakes_a_part_that_waits() -> None:
    held = [Held("p1", "m", 40), Held("p2", "m", 50), Held("p3", "m", 5), Held("q1", "n", 10)]
    got = room(held, {"m": 20}, cap_of({"m": 100, "n": 10}), open_batches=0, max_batches=10)
    # p2 does not fit beside 20 + 40: p3 (which would) waits behind it; n is another queue.
    assert [h.key for h in got.fit] == ["p1", "q1"]
    assert got.too_big == ()


def test_room_keeps_the_open_batch_bound_and_names_parts_too_big_alone() -> None:
    held = [Held("p1", "m", 10), Held("p2", "m", 10), Held("big", "n", 11), Held("n2", "n", 1)]
    got = room(held, {}, cap_of({"m": 100, "n": 10}), open_batches=8, max_batches=9)
    assert [h.key for h in got.fit] == ["p1"]
    got = room(held, {}, cap_of({"m": 100, "n": 10}), open_batches=0, max_batches=9)
    assert [h.key for h in got.too_big] == ["big"]
    assert [h.key for h in got.fit] == ["p1", "p2"]  # n2 waits behind the part to split
    assert room(held, {}, cap_of({"m": 100, "n": 10}), 12, 9).fit == ()


@settings(max_examples=300, deadline=None)
@given(
    held=st.lists(
        st.builds(
            Held, key=st.uuids().map(str), model=st.sampled_from("abc"), tokens=st.integers(1, 60)
        ),
        max_size=30,
    ),
    enqueued=st.dictionaries(st.sampled_from("abc"), st.integers(0, 100)),
    caps=st.fixed_dictionaries({m: st.integers(1, 100) for m in "abc"}),
    open_batches=st.integers(0, 12),
    max_batches=st.integers(1, 12),
)
def test_room_never_exceeds_a_cap_nor_the_open_batches_and_keeps_order(
    held: list[Held],
    enqueued: dict[str, int],
    caps: dict[str, int],
    open_batches: int,
    max_batches: int,
) -> None:
    got = room(held, enqueued, cap_of(caps), open_batches, max_batches)
    assert open_batches + len(got.fit) <= max(max_batches, open_batches)
    for model in "abc":
        mine = [h for h in got.fit if h.model == model]
        assert sum(h.tokens for h in mine) + enqueued.get(model, 0) <= max(
            caps[model], enqueued.get(model, 0)
        )
        # The model's fed parts are its first held parts (a prefix, in input order).
        assert mine == [h for h in held if h.model == model][: len(mine)]
    assert all(h.tokens > caps[h.model] for h in got.too_big)


def test_a_refusal_alone_halves_the_cap_and_a_full_queue_backs_off() -> None:
    assert learned_cap(3_000_000, 245_000) == 122_500
    assert learned_cap(100_000, 245_000) == 100_000  # never above what was known
    assert learned_cap(10, 1) == 1
    assert held_backoff_s(0) == 0.0
    assert held_backoff_s(1) == HELD_BACKOFF_S
    assert held_backoff_s(2) == 2 * HELD_BACKOFF_S
    assert held_backoff_s(99) == MAX_HELD_BACKOFF_S


def test_halving_converges_on_a_lower_real_cap_in_few_refusals() -> None:
    # A 4 M-token part against a real cap of 131 k: each lone refusal halves the cap, and
    # the number of refusals is log2 of the misjudgement.
    cap, part, refusals = 3_000_000, 3_000_000, 0
    while part > 131_000:
        cap = learned_cap(cap, part)
        part = cap
        refusals += 1
    assert refusals == 5


def test_a_plan_holds_parts_in_input_order_with_unpublished_nonces() -> None:
    from opstate.retry import jobs

    ranges = [PartRange(0, 2, 0, 20, 10), PartRange(2, 2, 20, 40, 10)]
    plan = jobs.new_plan("abc", "m", {"bytes": 40}, ranges)
    assert [p["phase"] for p in plan["parts"]] == [jobs.HELD, jobs.HELD]
    nonces = {p["nonce"] for p in plan["parts"]}
    assert len(nonces) == 2 and all(len(n) == 32 for n in nonces)
    assert jobs.display_name(plan, 1) == "opstate-job-abc-p1"
    assert all(n not in jobs.display_name(plan, 0) for n in nonces)
    # A part backing off holds back the parts after it (unless an operator's pass).
    jobs.claim(plan, 0, 99)
    jobs.released(plan, 0, 1_000, refused=True)
    assert jobs.waiting(plan, 1_000) == []
    assert [h.key for h in jobs.waiting(plan, 1_000, every=True)] == ["0", "1"]
    # Split: pieces replace the part in place, numbered after every part.
    jobs.split(plan, 0, [PartRange(0, 1, 0, 10, 5), PartRange(1, 1, 10, 20, 5)])
    assert [(p["n"], p["start"]) for p in plan["parts"]] == [(2, 0), (3, 10), (1, 20)]
    with pytest.raises(jobs.PlanError, match="do not cover"):
        jobs.split(plan, 1, [PartRange(2, 1, 20, 30, 5)])
    summary = jobs.summary(plan, 100)
    assert summary["parts"] == {"held": 3, "creating": 0, "created": 0, "ended": 0}
    assert summary["waitingFor"] == "room in the model's queue" and summary["rows"] == 4
    for n in (2, 3, 1):
        jobs.claim(plan, n, 5)
        jobs.created(plan, n, f"batches/b{n}")
    assert jobs.summary(plan, 100)["enqueuedTokens"] == 20
    jobs.ended(plan, 2)
    jobs.stop(plan, "retry --stop")
    assert not jobs.finished(plan)  # created parts still open
    jobs.ended(plan, 3)
    jobs.ended(plan, 1)
    assert jobs.finished(plan) and jobs.summary(plan, 100)["waitingFor"] == "nothing"


def test_a_plan_over_its_parts_bound_is_refused_before_anything() -> None:
    from opstate.retry import jobs

    many = (PartRange(i, 1, i, i + 1, 4) for i in range(jobs.MAX_PARTS + 1))
    with pytest.raises(jobs.PlanError, match="more than 400 parts"):
        jobs.new_plan("abc", "m", {}, many)
    with pytest.raises(jobs.PlanError, match="empty input"):
        jobs.new_plan("abc", "m", {}, [])


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(LINE, max_size=60), bounds=BOUNDS)
def test_a_hashed_split_is_the_split_with_each_parts_own_sha256(
    lines: list[bytes], bounds: Bounds
) -> None:
    import hashlib

    from opstate.domain.parts import split_hashed

    data = b"".join(lines)
    plain = list(split_lines(io.BytesIO(data), bounds))
    hashed = list(split_hashed(io.BytesIO(data), bounds))
    assert [p.__class__(p.first, p.rows, p.start, p.end, p.tokens) for p in hashed] == plain
    for part in hashed:
        assert part.sha256 == hashlib.sha256(data[part.start : part.end]).hexdigest()
