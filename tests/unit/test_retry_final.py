"""The final merge of a lineage (opstate.retry.final), and a simulated lineage driven by the
retry rules: one line per original key, the latest answer wins, no permanent failure is ever
retried, and the ledger counts what the lines hold."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from opstate.retry.final import FinalLedger, Member, choose, write_final
from opstate.retry.rules import (
    DEFAULT_TABLE,
    is_transient,
    lines,
    read_row,
    reason_history,
    select_retry,
    transient_failures,
)

CAP = 1 << 20
# outcome -> the output line of a key (None: the key is missing from the output)
OUTCOMES: dict[str, Callable[[str], dict[str, Any] | None]] = {
    "answered": lambda k: {"key": k, "response": {"candidates": [{"content": {"parts": []}}]}},
    "blocked": lambda k: {"key": k, "response": {"promptFeedback": {"blockReason": "SAFETY"}}},
    "unavailable": lambda k: {"key": k, "error": {"code": 503, "message": "try later"}},
    "exhausted": lambda k: {"key": k, "error": {"code": 429, "message": "resource exhausted"}},
    "internal": lambda k: {"key": k, "status": {"code": 13, "message": "oops"}},
    "deadline": lambda k: {"key": k, "error": {"code": 504, "message": "slow"}},
    "invalid": lambda k: {"key": k, "error": {"code": 400, "message": "bad request"}},
    "notfound": lambda k: {"key": k, "error": {"code": 404, "message": "no model"}},
    "quota": lambda k: {
        "key": k,
        "error": {"code": 429, "message": "Your prepayment credits are depleted."},
    },
    "missing": lambda k: None,
}
PERMANENT = {"invalid", "notfound", "quota"}
TRANSIENT = {
    "unavailable": "UNAVAILABLE",
    "exhausted": "RESOURCE_EXHAUSTED",
    "internal": "INTERNAL",
    "deadline": "DEADLINE_EXCEEDED",
}
ANSWERED = {"answered", "blocked"}


def jsonl(rows: Iterable[dict[str, Any] | None]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows if r is not None)


def chunked(data: bytes, size: int = 7) -> Callable[[], Iterable[bytes]]:
    return lambda: [data[i : i + size] for i in range(0, len(data), size)]


def inputs(keys: Iterable[str]) -> bytes:
    return jsonl({"key": k, "request": {"contents": []}} for k in keys)


def run_final(members: list[Member], input_data: bytes) -> tuple[list[dict[str, Any]], FinalLedger]:
    out = bytearray()
    ledger = write_final(members, chunked(input_data), out.extend, CAP)
    assert out.endswith(b"\n") or not out
    return [json.loads(x) for x in lines([bytes(out)], CAP)], ledger


def oracle(
    plan: dict[str, list[str]], held: dict[int, list[str]], attempt: int, most: int
) -> set[str]:
    """The keys attempt + 1 should hold: each transient failure of ``attempt`` while attempts
    and its reason's limit last (counted from the plan, not by the rules under test)."""
    expected = set()
    for key in held[attempt] if attempt + 1 <= most else []:
        reason = TRANSIENT.get(plan[key][attempt])
        if reason is None:
            continue
        seen = sum(
            TRANSIENT.get(plan[key][a]) == reason for a in range(attempt + 1) if key in held[a]
        )
        limit = DEFAULT_TABLE.limits[reason]
        if limit is None or seen <= limit:
            expected.add(key)
    return expected


def simulate(
    plan: dict[str, list[str]], max_attempts: int
) -> tuple[dict[int, list[str]], dict[int, bytes]]:
    """Run the lineage with the rules: attempt -> the keys its input held, and its output."""
    held = {0: list(plan)}
    outputs: dict[int, bytes] = {}
    attempt = 0
    while True:
        outputs[attempt] = jsonl(OUTCOMES[plan[k][attempt]](k) for k in held[attempt])
        candidates = transient_failures(lines([outputs[attempt]], CAP), DEFAULT_TABLE)
        everything = b"".join(outputs[a] for a in sorted(outputs))
        history = reason_history(lines([everything], CAP), set(candidates), DEFAULT_TABLE)
        chosen = select_retry(candidates, history, DEFAULT_TABLE, attempt + 1, max_attempts)
        for key in chosen:  # never a permanent failure, an answer or a missing row
            outcome = plan[key][attempt]
            assert outcome not in PERMANENT | ANSWERED | {"missing"}, (key, outcome)
        assert chosen == oracle(plan, held, attempt, max_attempts)
        if not chosen:
            return held, outputs
        attempt += 1
        held[attempt] = [k for k in plan if k in chosen]


def expected_line(plan: dict[str, list[str]], held: dict[int, list[str]], key: str) -> Any:
    tried = [a for a in sorted(held) if key in held[a]]
    answers = [a for a in tried if plan[key][a] in ANSWERED]
    failures = [a for a in tried if plan[key][a] not in ANSWERED | {"missing"}]
    if answers or failures:
        attempt = (answers or failures)[-1]
        return {**(OUTCOMES[plan[key][attempt]](key) or {}), "attempt": attempt}
    error = {"code": "missing", "message": "no attempt returned this key"}
    return {"key": key, "error": error, "attempt": tried[-1]}


def counts(final: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
    answered = [r for r in final if "response" in r]
    errors: dict[str, int] = {}
    for r in final:
        if "response" not in r:
            status: Any = r.get("error") or r.get("status")
            code = str(status["code"])
            errors[code] = errors.get(code, 0) + 1
    rows = {
        "total": len(final),
        "answered": len(answered),
        "blocked": sum("promptFeedback" in r["response"] for r in answered),
        "failed": len(final) - len(answered),
    }
    return rows, errors


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(sorted(OUTCOMES)), min_size=4, max_size=4),
        min_size=1,
        max_size=12,
    ),
    st.integers(min_value=0, max_value=3),
    st.randoms(use_true_random=False),
)
def test_a_simulated_lineage_ends_with_one_line_per_key(
    plans: list[list[str]], max_attempts: int, shuffle: Any
) -> None:
    keys = [f"k{i}" for i in range(len(plans))]
    plan = dict(zip(keys, plans, strict=True))
    held, outputs = simulate(plan, max_attempts)
    members = [
        Member(a, f"batches/a{a}", chunked(outputs[a]), chunked(inputs(held[a])))
        for a in sorted(outputs)
    ]
    shuffle.shuffle(members)  # the rank is by attempt, not by position
    final, ledger = run_final(members, inputs(keys))

    assert sorted(row["key"] for row in final) == sorted(keys)
    by_key = {row["key"]: row for row in final}
    for key in keys:
        assert by_key[key] == expected_line(plan, held, key)
    rows, errors = counts(final)
    assert ledger.as_dict() == {
        "rows": rows,
        "errors": errors,
        "retried": len({k for a in held if a >= 1 for k in held[a]}),
        "attempts": len(outputs),
    }
    assert ledger.extra == 0


def member(attempt: int, rows: list[dict[str, Any] | None], name: str = "") -> Member:
    return Member(attempt, name or f"batches/a{attempt}", chunked(jsonl(rows)))


def test_choose_prefers_the_latest_answer_then_the_latest_failure() -> None:
    ok, bad = OUTCOMES["answered"], OUTCOMES["unavailable"]
    members = [
        member(0, [ok("a"), bad("b"), bad("c"), bad("d")]),
        member(1, [bad("a"), ok("b"), bad("c")]),
        member(1, [bad("d")], "batches/second-of-attempt-1"),
        member(2, [bad("b"), bad("c")]),
    ]
    assert choose(members, CAP) == {"a": 0, "b": 1, "c": 3, "d": 2}
    # equal attempts: the later member wins
    assert choose([member(1, [bad("x")]), member(1, [bad("x")])], CAP) == {"x": 1}


def test_within_one_member_an_answer_wins_then_the_later_line() -> None:
    ok, bad = OUTCOMES["answered"], OUTCOMES["invalid"]
    data = jsonl([ok("a"), bad("a"), bad("b"), OUTCOMES["unavailable"]("b")])
    final, ledger = run_final([Member(0, "batches/r", chunked(data))], inputs(["a", "b"]))
    assert final == [
        {**(ok("a") or {}), "attempt": 0},
        {**(OUTCOMES["unavailable"]("b") or {}), "attempt": 0},
    ]
    assert ledger.as_dict()["errors"] == {"503": 1}


def test_extra_keys_missing_keys_and_members_without_output() -> None:
    ok = OUTCOMES["answered"]
    members = [
        member(0, [ok("a"), ok("stranger"), {"key": "b", "neither": True}]),
        Member(1, "batches/expired", None, chunked(inputs(["c"]))),
        member(1, []),  # an empty output
    ]
    # lines that cannot be read are skipped, not fatal
    members.append(Member(2, "batches/x", lambda: [b"garbage\n", b"\n", b'{"key": 5}\n']))
    final, ledger = run_final(members, inputs(["a", "b", "c", "d"]))
    assert final == [
        {**(ok("a") or {}), "attempt": 0},
        {"key": "b", "neither": True, "attempt": 0},
        {
            "key": "c",
            "error": {"code": "missing", "message": "no attempt returned this key"},
            "attempt": 1,
        },
        {
            "key": "d",
            "error": {"code": "missing", "message": "no attempt returned this key"},
            "attempt": 0,
        },
    ]
    assert ledger == FinalLedger(
        total=4,
        answered=1,
        blocked=0,
        failed={"unknown": 1, "missing": 2},
        retried=1,
        attempts=4,
        extra=1,
        unreadable=1,  # b"garbage" (a line without a text key is no row of any key)
    )
    assert ledger.as_dict()["rows"] == {"total": 4, "answered": 1, "blocked": 0, "failed": 3}


def test_a_quota_refusal_is_never_selected() -> None:
    row = read_row(jsonl([OUTCOMES["quota"]("q")]).strip())
    assert row is not None and is_transient(row, DEFAULT_TABLE) is None


def strict(line: bytes) -> Any:
    """A line read by a strict JSON parser: UTF-8, no NaN/Infinity, no lone surrogate."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    value = json.loads(line.decode("utf-8"), parse_constant=refuse)
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate cannot encode
    return value


def test_unreadable_rows_are_left_out_and_every_final_line_is_strict_json() -> None:
    """A lone surrogate escape, NaN or Infinity makes that row unreadable (counted), never the
    whole final; 1e400 is valid JSON text and is kept as Gemini wrote it (bytes copied)."""
    surrogate = b'{"key": "k1", "response": {"candidates": [{"content": {"parts": [{"text": '
    surrogate += b'"\\ud800"}]}}]}}'
    nan = b'{"key": "k2", "response": {"candidates": [], "x": NaN}}'
    huge = b'{"key": "k3", "response": {"candidates": [{"avgLogprobs": 1e400, "content": {}}]}}'
    infinity = b'{"key": "k4", "error": {"code": 503, "message": "later", "x": -Infinity}}'
    root = Member(0, "batches/r", chunked(b"\n".join([surrogate, nan, huge, infinity]) + b"\n"))
    answer = OUTCOMES["answered"]("k2") or {}
    child = Member(1, "batches/c", chunked(jsonl([answer])), chunked(inputs(["k2"])))
    out = bytearray()
    ledger = write_final([root, child], chunked(inputs(["k1", "k2", "k3", "k4"])), out.extend, CAP)
    written = bytes(out).splitlines()
    assert [strict(line)["key"] for line in written] == ["k1", "k2", "k3", "k4"]  # input order
    missing = {"code": "missing", "message": "no attempt returned this key"}
    assert strict(written[0]) == {"key": "k1", "error": missing, "attempt": 0}
    assert strict(written[1]) == {**answer, "attempt": 1}
    assert written[2] == huge[:-1] + b',"attempt":0}'  # the row's own text, 1e400 kept
    assert strict(written[3]) == {"key": "k4", "error": missing, "attempt": 0}
    assert ledger.unreadable == 3
    assert ledger.as_dict()["rows"] == {"total": 4, "answered": 2, "blocked": 0, "failed": 2}


def test_a_member_row_counts_only_for_keys_that_member_was_given() -> None:
    """A retry child answering a key it was never sent (the root answered it) or one the input
    lacks does not replace the root's line: left out, counted ``foreign`` / ``extra``."""
    ok, bad = OUTCOMES["answered"], OUTCOMES["unavailable"]
    root = member(0, [bad("k1"), OUTCOMES["invalid"]("k2")])
    stray = {"key": "k2", "response": {"candidates": [{"content": {"parts": [{"text": "?"}]}}]}}
    child = Member(
        1, "batches/c", chunked(jsonl([ok("k1"), stray, ok("k9")])), chunked(inputs(["k1"]))
    )
    final, ledger = run_final([root, child], inputs(["k1", "k2"]))
    assert final == [
        {**(ok("k1") or {}), "attempt": 1},
        {**(OUTCOMES["invalid"]("k2") or {}), "attempt": 0},
    ]
    assert (ledger.foreign, ledger.extra, ledger.retried) == (1, 1, 1)
    # a member whose input is not known is taken as given every key (as before)
    unknown = member(1, [ok("k1"), stray])
    final, ledger = run_final([root, unknown], inputs(["k1", "k2"]))
    assert {row["key"]: row["attempt"] for row in final} == {"k1": 1, "k2": 1}
    assert ledger.foreign == 0
