"""The keys a retry attempt takes, over key digests (opstate.retry.selection): the same keys as
the rules' own functions over key texts (``transient_failures``, ``reason_history``,
``select_retry``), for any outputs; and memory that does not grow with the keys' text."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from opstate.retry.inputs import subset
from opstate.retry.reading import KeyIndex
from opstate.retry.rules import (
    DEFAULT_TABLE,
    lines,
    parse_table,
    reason_history,
    select_retry,
    transient_failures,
)
from opstate.retry.selection import select_keys
from tests.unit.test_retry_memory import LONG_KEYS, MIB, generated, peak_added

CAP = 1 << 20
ROWS = {
    "ok": lambda k: {"key": k, "response": {"candidates": [{"content": {}}]}},
    "503": lambda k: {"key": k, "error": {"code": 503, "message": "later"}},
    "429": lambda k: {"key": k, "error": {"code": 429, "message": "slow down"}},
    "500": lambda k: {"key": k, "status": {"code": 13, "message": "oops"}},
    "504": lambda k: {"key": k, "error": {"code": 504, "message": "slow"}},
    "400": lambda k: {"key": k, "error": {"code": 400, "message": "bad"}},
    "bad": lambda k: None,
}


def jsonl(rows: Iterable[tuple[str, str]]) -> bytes:
    out = []
    for key, outcome in rows:
        row = ROWS[outcome](key)
        out.append(
            json.dumps(row).encode() if row is not None else b'{"key": "%s", x}' % key.encode()
        )
    return b"\n".join(out) + b"\n"


def reader(data: bytes) -> Callable[[], Iterable[bytes]]:
    return lambda: lines([data], CAP)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from("abcdefz"), st.sampled_from(sorted(ROWS))), max_size=10),
        min_size=1,
        max_size=4,
    ),
    st.integers(min_value=0, max_value=4),
    st.sampled_from(["", "UNAVAILABLE:1,INTERNAL", "RESOURCE_EXHAUSTED:2,DEADLINE_EXCEEDED:0"]),
)
def test_the_keys_taken_are_the_rules_own(
    outputs: list[list[tuple[str, str]]], max_attempts: int, spelled: str
) -> None:
    table = parse_table(spelled) if spelled else DEFAULT_TABLE
    data = [jsonl(rows) for rows in outputs]
    input_keys = list("abcdef")  # "z" rows: a key the input lacks
    attempt = len(data)  # the latest output is attempt len - 1
    candidates = transient_failures(lines([data[-1]], CAP), table)
    history: dict[str, Counter[str]] = {}
    for output in data:
        for key, seen in reason_history(lines([output], CAP), set(candidates), table).items():
            history.setdefault(key, Counter()).update(seen)
    expected = select_retry(candidates, history, table, attempt, max_attempts) & set(input_keys)
    index = KeyIndex(input_keys)
    chosen = select_keys(
        index, reader(data[-1]), [reader(d) for d in data], table, attempt, max_attempts
    )
    assert {k for k in input_keys if k in chosen} == expected
    assert len(chosen) == len(expected) and "z" not in chosen and 5 not in chosen


def test_many_failed_long_keys_are_chosen_without_holding_their_text() -> None:
    count = LONG_KEYS  # 512-character keys, more text than the bound, every one failed 503
    source = generated(count, lambda k: b'{"key":"%s","request":{}}\n' % k.encode())
    output = generated(count, lambda k: b'{"key":"%s","error":{"code":503}}\n' % k.encode())
    picked = [0]

    def work() -> None:
        index = KeyIndex(
            json.loads(line)["key"] for line in lines(source(), CAP)
        )  # the engine reads keys with reading.key_of; json here is only the test's
        latest = lambda: lines(output(), CAP)  # noqa: E731
        chosen = select_keys(index, latest, [latest], DEFAULT_TABLE, 1, 1)
        assert len(chosen) == count
        for _ in subset(source(), chosen, CAP):
            picked[0] += 1

    assert peak_added(work) < 6 * MIB
    assert picked[0] == count
