"""The final result's exact choices, counts and bounds (opstate.retry.final), pinned through its
public functions only (``write_final``, ``choose``, ``FinalLedger``) so that ``make mutate``
kills what test_retry_final.py's simulations let through (issue 39): which line of a key is
kept, the ``retried`` count, the line cap's boundaries, the codes counted, the missing lines.

Mutants of final.py no test can kill (equivalent: no input tells them apart) are said in a
comment beside their line in final.py (``# mutant ...: equivalent, because ...``), so the reason
stays with the code it is about.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from opstate.outcomes.plan import MAX_COUNTED_CODES, OTHER_CODES
from opstate.retry.final import FinalLedger, Member, choose, write_final

CAP = 1 << 16


def jsonl(*rows: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in rows)


def source(data: bytes) -> Callable[[], Iterable[bytes]]:
    return lambda: [data[i : i + 5] for i in range(0, len(data), 5)]


def ok(key: str, tag: str = "") -> dict[str, Any]:
    return {"key": key, "response": {"candidates": [{"finishReason": "STOP"}], "tag": tag}}


def blocked(key: str) -> dict[str, Any]:
    return {"key": key, "response": {"candidates": [{"finishReason": "SAFETY"}]}}


def err(key: str, code: object = 503, tag: str = "") -> dict[str, Any]:
    return {"key": key, "error": {"code": code, "message": tag}}


def inputs(*keys: str) -> bytes:
    return jsonl(*({"key": k, "request": {}} for k in keys))


def member(attempt: int, name: str, *rows: dict[str, Any], held: bytes | None = None) -> Member:
    return Member(attempt, name, source(jsonl(*rows)), source(held) if held is not None else None)


def final(
    members: list[Member], keys: bytes, cap: int = CAP
) -> tuple[dict[str, dict[str, Any]], list[str], FinalLedger]:
    out = bytearray()
    ledger = write_final(members, source(keys), out.extend, cap)
    lines = [json.loads(line) for line in bytes(out).splitlines()]
    return {line["key"]: line for line in lines}, [line["key"] for line in lines], ledger


def test_the_line_kept_answered_first_then_latest_attempt_then_later_member_and_line() -> None:
    members = [
        member(0, "root", ok("a", "root"), err("b", tag="root"), err("c", tag="root"), ok("d")),
        member(1, "c1", err("a", tag="c1"), err("b", tag="c1 first"), err("b", tag="c1 later")),
        member(1, "c1bis", ok("c", "c1bis"), err("d", tag="c1bis")),
        member(2, "c2", err("c", tag="c2")),
    ]
    by_key, order, ledger = final(members, inputs("a", "b", "c", "d", "e"))
    # a: the root's answer beats a later failure
    assert (by_key["a"]["attempt"], by_key["a"]["response"]["tag"]) == (0, "root")
    # b: failures only: the latest attempt, its later line
    assert (by_key["b"]["attempt"], by_key["b"]["error"]["message"]) == (1, "c1 later")
    # c: an answer in attempt 1 beats a failure in attempt 2
    assert (by_key["c"]["attempt"], by_key["c"]["response"]["tag"]) == (1, "c1bis")
    assert by_key["d"]["attempt"] == 0 and "response" in by_key["d"]
    assert by_key["e"] == {
        "key": "e",
        "error": {"code": "missing", "message": "no attempt returned this key"},
        "attempt": 0,
    }
    # written in the input's order, the missing key in its place
    assert order == ["a", "b", "c", "d", "e"]
    assert ledger == FinalLedger(
        total=5,
        answered=3,
        blocked=0,
        failed={"503": 1, "missing": 1},
        retried=4,  # a, b, c, d: each had a line in an attempt >= 1; e none
        attempts=4,
        extra=0,
    )
    assert choose(members, CAP) == {"a": 0, "b": 1, "c": 2, "d": 0}


def test_equal_attempts_the_later_member_wins_both_ways() -> None:
    first = member(1, "x", ok("k", "x"))
    second = member(1, "y", ok("k", "y"))
    root = member(0, "root", err("k"))
    by_key, _order, _ledger = final([root, first, second], inputs("k"))
    assert by_key["k"]["response"]["tag"] == "y"
    by_key, _order, _ledger = final([root, second, first], inputs("k"))
    assert by_key["k"]["response"]["tag"] == "x"
    assert choose([root, first, second], CAP) == {"k": 2}
    assert choose([root, second, first], CAP) == {"k": 2}
    # a later attempt listed first still outranks an earlier one listed after it
    assert choose([member(2, "late", err("k")), member(1, "early", err("k"))], CAP) == {"k": 0}
    three = [member(0, "r", err("k")), member(1, "a", err("k")), member(2, "b", err("k"))]
    assert choose(three, CAP) == {"k": 2}
    assert choose(list(reversed(three)), CAP) == {"k": 0}


def test_retried_counts_keys_an_attempt_from_one_held() -> None:
    members = [
        member(0, "root", err("only-root"), err("held-answered"), err("gone")),
        member(1, "c1", ok("held-answered"), held=inputs("held-answered", "gone")),
    ]
    by_key, _order, ledger = final(members, inputs("only-root", "held-answered", "gone", "never"))
    assert ledger.retried == 2  # held-answered (answered in attempt 1), gone (held, no line)
    assert by_key["gone"]["attempt"] == 0 and by_key["gone"]["error"]["code"] == 503
    assert by_key["never"]["attempt"] == 0
    # a key held by attempt 1's input but in no output: missing, attempt 1, retried
    members = [member(0, "root"), member(1, "c1", held=inputs("k"))]
    by_key, _order, ledger = final(members, inputs("k"))
    assert by_key["k"]["attempt"] == 1 and by_key["k"]["error"]["code"] == "missing"
    assert ledger.retried == 1 and ledger.failed == {"missing": 1}
    # held by attempts 1 and 2: the highest
    members = [member(0, "r"), member(2, "c2", held=inputs("k")), member(1, "c1", held=inputs("k"))]
    by_key, _order, ledger = final(members, inputs("k"))
    assert by_key["k"]["attempt"] == 2 and ledger.retried == 1
    # a root's own input (attempt 0) is no retry; nor a member whose input is not known
    members = [member(0, "r", held=inputs("k")), Member(1, "c1", None, None)]
    by_key, _order, ledger = final(members, inputs("k"))
    assert by_key["k"]["attempt"] == 0 and ledger.retried == 0
    # the root answered, a retry's line of the key failed later: kept the answer, retried
    members = [member(0, "r", ok("k")), member(1, "c1", err("k"))]
    _by_key, _order, ledger = final(members, inputs("k"))
    assert (ledger.retried, ledger.answered) == (1, 1)
    # an attempt-1 line first, then the root's: still retried
    members = [member(1, "c1", err("k")), member(0, "r", ok("k"))]
    by_key, _order, ledger = final(members, inputs("k"))
    assert (ledger.retried, by_key["k"]["attempt"]) == (1, 0)
    # retried is not answered: a failed retried key stays failed
    members = [member(0, "r", ok("k")), member(1, "c1", err("k")), member(1, "c2", err("k"))]
    by_key, _order, ledger = final(members, inputs("k"))
    assert "response" in by_key["k"] and ledger.answered == 1 and ledger.retried == 1


def test_output_keys_the_input_lacks_are_extra_one_per_line() -> None:
    members = [member(0, "r", ok("k"), ok("x"), err("x"), {"key": 3}, {"no": "key"})]
    _by_key, order, ledger = final(members, inputs("k"))
    assert order == ["k"] and ledger.extra == 2 and ledger.total == 1


def test_the_line_cap_boundaries() -> None:
    row = ok("k")
    exact = len(json.dumps(row, separators=(",", ":")).encode())
    members = [member(0, "r", row)]
    by_key, _order, ledger = final(members, inputs("k"), cap=exact + 64)
    assert "response" in by_key["k"]
    # a line exactly at the cap is read; one byte over is read past (the key is missing)
    keys = b'{"key":"k"}\n'
    by_key, _order, ledger = final(members, keys, cap=max(exact, len(keys)))
    assert "response" in by_key["k"] and ledger.answered == 1
    by_key, _order, ledger = final(members, keys, cap=exact - 1)
    assert by_key["k"]["error"]["code"] == "missing" and ledger.answered == 0
    # the same for an input line: over the cap, its key is not an original key
    long_key = {"key": "k", "request": {"pad": "x" * 40}}
    size = len(json.dumps(long_key, separators=(",", ":")).encode())
    _by_key, order, _ledger = final([], jsonl(long_key), cap=size)
    assert order == ["k"]
    _by_key, order, _ledger = final([], jsonl(long_key), cap=size - 1)
    assert order == []


def test_codes_blocked_and_unknown_are_counted() -> None:
    codes = [f"c{i}" for i in range(MAX_COUNTED_CODES + 2)]
    rows = [err(f"k{i}", code) for i, code in enumerate(codes)]
    keys = [f"k{i}" for i in range(len(codes))]
    _by_key, _order, ledger = final([member(0, "r", *rows)], inputs(*keys))
    assert len(ledger.failed) == MAX_COUNTED_CODES + 1
    assert ledger.failed[OTHER_CODES] == 2 and ledger.failed["c0"] == 1
    assert f"c{MAX_COUNTED_CODES - 1}" in ledger.failed
    assert f"c{MAX_COUNTED_CODES}" not in ledger.failed
    rows2 = [
        blocked("b"),
        {"key": "n", "error": {"message": "no code"}},
        {"key": "s", "status": {"code": 13}},
        {"key": "w", "neither": 1},
        err("z", ""),
    ]
    _by_key, _order, ledger = final([member(0, "r", *rows2)], inputs("b", "n", "s", "w", "z"))
    assert (ledger.answered, ledger.blocked) == (1, 1)
    assert ledger.failed == {"unknown": 3, "13": 1}
    assert ledger.as_dict() == {
        "rows": {"total": 5, "answered": 1, "blocked": 1, "failed": 4},
        "errors": {"unknown": 3, "13": 1},
        "retried": 0,
        "attempts": 1,
    }


def test_a_member_without_output_still_counts_as_an_attempt() -> None:
    members = [member(0, "r", ok("k")), Member(1, "expired", None, None)]
    _by_key, _order, ledger = final(members, inputs("k"))
    assert ledger.attempts == 2 and ledger.answered == 1
    assert choose(members, CAP) == {"k": 0}
    assert FinalLedger().as_dict() == {
        "rows": {"total": 0, "answered": 0, "blocked": 0, "failed": 0},
        "errors": {},
        "retried": 0,
        "attempts": 0,
    }


def test_choose_tells_many_members_apart() -> None:
    members = [member(i % 3, f"m{i}", err("k")) for i in range(7)]
    # attempts 0,1,2,0,1,2,0: the latest attempt 2 at the highest position wins
    assert choose(members, CAP) == {"k": 5}
    members = [member(i, f"m{i}", err(f"k{i}")) for i in range(6)]
    assert choose(members, CAP) == {f"k{i}": i for i in range(6)}


def test_a_member_without_output_first_does_not_end_the_reading() -> None:
    members = [Member(1, "expired", None, None), member(0, "r", ok("k")), member(2, "c", err("j"))]
    by_key, order, ledger = final(members, inputs("k", "j"))
    assert order == ["k", "j"] and "response" in by_key["k"] and by_key["j"]["attempt"] == 2
    assert choose(members, CAP) == {"k": 1, "j": 2}
    assert ledger.attempts == 3


def test_input_lines_that_name_no_text_key_are_no_keys() -> None:
    keys = b'[1]\n"s"\n{"key": 3}\n{"nokey": 1}\n{"key": "k"}\nnot json\n'
    by_key, order, ledger = final([member(0, "r", ok("k"))], keys)
    assert order == ["k"] and ledger.total == 1 and "response" in by_key["k"]
    members = [member(0, "r"), member(1, "c", held=keys)]
    _by_key, order, ledger = final(members, inputs("k"))
    assert order == ["k"] and ledger.retried == 1


def test_the_ledger_and_members_are_values() -> None:
    assert FinalLedger().extra == 0 and FinalLedger().attempts == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        FinalLedger().total = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Member(0, "r", None).attempt = 1  # type: ignore[misc]


def test_final_lines_are_utf_8_not_escaped() -> None:
    # A member's row is copied as its own bytes (issue 39: final.jsonl keeps what Gemini wrote),
    # so UTF-8 stays UTF-8; a line opstate writes itself (a key nothing answered) is UTF-8 too,
    # never \\u-escaped (kills strict_json's ensure_ascii mutant through ``_dump``).
    out = bytearray()
    row = '{"key":"clé","response":{"candidates":[{"finishReason":"STOP"}],"tag":"réponse ✓"}}'
    members = [Member(0, "r", source(row.encode() + b"\n"), None)]
    write_final(members, source(inputs("clé", "nié")), out.extend, CAP)
    lines = bytes(out).splitlines()
    assert "réponse ✓".encode() in lines[0] and b"\\u" not in bytes(out)
    assert [json.loads(line)["key"] for line in lines] == ["clé", "nié"]
    assert json.loads(lines[1])["error"]["code"] == "missing"


def test_a_line_without_a_key_does_not_end_a_members_reading() -> None:
    # a readable line naming no text key is passed over (neither extra nor unreadable), and the
    # member's later lines still count, in ``write_final`` and in ``choose``
    members = [member(0, "r", {"no": "key"}, {"key": 3}, ok("k"))]
    by_key, order, ledger = final(members, inputs("k"))
    assert order == ["k"] and "response" in by_key["k"]
    assert (ledger.answered, ledger.extra, ledger.unreadable) == (1, 0, 0)
    assert choose(members, CAP) == {"k": 0}


def test_choose_passes_over_unreadable_and_keyless_lines() -> None:
    rows = b'not json\n{"key":"a","n":NaN}\n{"no":"key"}\n' + jsonl(err("k"))
    members = [Member(0, "r", source(rows + jsonl(err("j"))), None), member(1, "c", ok("k"))]
    assert choose(members, CAP) == {"k": 1, "j": 0}


def test_a_large_row_with_an_attempt_of_its_own_is_unreadable_and_the_next_row_is_read() -> None:
    # over 1 MiB (reading.SMALL_BYTES) with an "attempt" member of its own: final_line refuses to
    # re-serialise it; the line is counted unreadable once and the member's next line is kept
    big = {"key": "big", "attempt": 7, "response": {"pad": "x" * (1 << 20)}}
    members = [member(0, "r", big, ok("k", "after"))]
    by_key, order, ledger = final(members, inputs("big", "k"), cap=1 << 21)
    assert order == ["big", "k"]
    assert by_key["k"]["response"]["tag"] == "after" and by_key["k"]["attempt"] == 0
    assert by_key["big"]["error"]["code"] == "missing"
    assert (ledger.unreadable, ledger.answered, ledger.failed) == (1, 1, {"missing": 1})


def test_a_missing_line_is_compact_strict_json() -> None:
    out = bytearray()
    write_final([member(1, "c", held=inputs("k"))], source(inputs("k")), out.extend, CAP)
    assert bytes(out) == (
        b'{"key":"k","error":{"code":"missing","message":"no attempt returned this key"},'
        b'"attempt":1}\n'
    )


def test_the_attempt_written_for_a_missing_key_stops_at_255() -> None:
    # the highest attempt whose input held a key is kept in one byte: attempts above 255 are
    # written as 255 (still counted retried), 255 itself as is
    for attempt, written in ((255, 255), (256, 255), (300, 255), (254, 254)):
        members = [member(0, "r"), member(attempt, "c", held=inputs("k"))]
        by_key, _order, ledger = final(members, inputs("k"))
        assert by_key["k"]["attempt"] == written and ledger.retried == 1
