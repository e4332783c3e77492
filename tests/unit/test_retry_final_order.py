"""``final.jsonl`` in the input's order (issues 40 and 46; opstate.retry.final): for arbitrary
lineages (outputs in shuffled order, retries answering a subset, missing, extra and foreign keys,
unreadable rows, repeated lines of a key, blank lines) ``write_final`` writes exactly the lines
of an independent reference model, one per input key at its first line, for every window
budget down to 1 byte; and it reads the outputs once per window.

Why the order comes from the input and never from an output. google-genai 3.6.1 documents
``BatchJobDestination.file_name`` (google/genai/types.py) as: "The responses will be written in
the same order as the input requests." Users report the opposite: googleapis/python-genai#1909
("Batch API InlinedResponses are not returned in order", open, labelled type: bug): "We
confirmed the results are not ordered by the API, it is difficult to reproduce it consistently
but we observed it with large number of requests (ie. 10K+ requests)", and for a file: "I
uploaded a JSONL batch file along with keys for corresponding requests, the responses are still
not in order." And a retry batch holds only the keys it retries, in its own order. So the
outputs here come shuffled, and the test never relies on their order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from opstate.retry.final import ENTRY_BYTES, FinalLedger, Member, write_final
from opstate.retry.rules import row_of

CAP = 1 << 16
MISSING = {"code": "missing", "message": "no attempt returned this key"}
UNREADABLE = (b"not json", b'{"key":"k0","response":{"x":NaN}}', b'{"key":"k1","t":"\\ud800"}')


def source(data: bytes, size: int = 7) -> Callable[[], Iterable[bytes]]:
    return lambda: [data[i : i + size] for i in range(0, len(data), size)]


class Reads:
    """A chunk source that counts how often it is read."""

    def __init__(self, data: bytes, size: int = 7) -> None:
        self.data = data
        self.size = size
        self.count = 0

    def __call__(self) -> Iterable[bytes]:
        self.count += 1
        return source(self.data, self.size)()


def compact(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def request(key: str) -> bytes:
    return compact({"key": key, "request": {"contents": []}})


def strict(line: bytes) -> Any:
    """A line as a strict reader takes it (None when it is not a strict JSON object)."""

    def refuse(name: str) -> Any:
        raise ValueError(name)

    try:
        value = json.loads(line.decode("utf-8"), parse_constant=refuse)
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass
class Lineage:
    input_lines: list[bytes]
    members: list[tuple[int, list[bytes], list[bytes] | None]]  # attempt, output, input


def reference(lineage: Lineage) -> tuple[bytes, dict[str, Any]]:  # noqa: C901 - a plain model
    """What ``final.jsonl`` holds, built the plain way: every line of every output in memory,
    per key the best (answered, attempt, member position, line), then the input's keys in
    order; and the ledger's counts."""
    order: list[str] = []
    for line in lineage.input_lines:
        value = strict(line)
        key = value.get("key") if value is not None else None
        if isinstance(key, str) and key not in order:
            order.append(key)
    held: dict[str, int] = {}
    for attempt, _output, given_lines in lineage.members:
        for line in given_lines or []:
            value = strict(line)
            if value is not None and isinstance(value.get("key"), str) and attempt >= 1:
                held[value["key"]] = max(held.get(value["key"], 0), min(attempt, 255))
    best: dict[str, tuple[tuple[int, int, int, int], bytes, int]] = {}
    retried: set[str] = set()
    left = {"extra": 0, "foreign": 0, "unreadable": 0}
    for position, (attempt, output, given_lines) in enumerate(lineage.members):
        given_keys = None if given_lines is None else {strict(x)["key"] for x in given_lines}
        for number, line in enumerate(output):
            if not line.strip():
                continue
            value = strict(line)
            if value is None:
                left["unreadable"] += 1
                continue
            key = value.get("key")
            if not isinstance(key, str):
                continue
            if key not in order:
                left["extra"] += 1
                continue
            if given_keys is not None and key not in given_keys:
                left["foreign"] += 1
                continue
            if attempt >= 1:
                retried.add(key)
            rank = (isinstance(value.get("response"), dict), attempt, position, number)
            if key not in best or rank > best[key][0]:
                best[key] = (rank, line, attempt)
    out = bytearray()
    counts: dict[str, Any] = {"answered": 0, "blocked": 0, "errors": {}}
    for key in order:
        if key in best:
            _rank, line, attempt = best[key]
            out += line.rstrip()[:-1] + b',"attempt":%d}\n' % attempt
            row = row_of(strict(line))
            assert row is not None
            if row.answered:
                counts["answered"] += 1
                counts["blocked"] += row.blocked
                continue
            code = row.code or "unknown"
        else:
            out += compact({"key": key, "error": MISSING, "attempt": held.get(key, 0)}) + b"\n"
            code = "missing"
        counts["errors"][code] = counts["errors"].get(code, 0) + 1
    counts["retried"] = len({k for k in order if k in retried or held.get(k, 0) >= 1})
    counts["total"] = len(order)
    return bytes(out), {**counts, **left}


def row(key: str, outcome: str, tag: int) -> bytes:
    if outcome == "answered":
        return compact({"key": key, "response": {"candidates": [{"n": tag}]}})
    if outcome == "blocked":
        return compact({"key": key, "response": {"promptFeedback": {"blockReason": "SAFETY"}}})
    if outcome == "bare":
        return compact({"key": key, "neither": tag})
    code = {"e503": 503, "e400": 400, "e429": 429}[outcome]
    return compact({"key": key, "error": {"code": code, "message": f"m{tag}"}})


OUTCOMES = ("answered", "blocked", "e503", "e400", "e429", "bare")


@st.composite
def lineages(draw: st.DrawFn) -> Lineage:
    count = draw(st.integers(min_value=0, max_value=9))
    keys = [f"k{i}" for i in range(count)]
    order = draw(st.permutations(keys))
    input_lines = [request(k) for k in order]
    if order and draw(st.booleans()):  # a key twice: one line, at its first place
        input_lines.insert(
            draw(st.integers(0, len(input_lines))), request(draw(st.sampled_from(order)))
        )
    if draw(st.booleans()):  # lines that name no key
        input_lines.insert(draw(st.integers(0, len(input_lines))), b'{"nokey":1}')
    members: list[tuple[int, list[bytes], list[bytes] | None]] = []
    tag = 0
    for position in range(draw(st.integers(min_value=1, max_value=4))):
        attempt = 0 if position == 0 else draw(st.integers(min_value=0, max_value=3))
        pool = [*keys, "stranger"]
        sent = draw(st.lists(st.sampled_from(keys), unique=True)) if keys else []
        answering = draw(st.lists(st.sampled_from(pool), max_size=12))
        output = []
        for key in answering:
            tag += 1
            output.append(row(key, draw(st.sampled_from(OUTCOMES)), tag))
        output += draw(st.lists(st.sampled_from([*UNREADABLE, b"", b"  "]), max_size=2))
        output = draw(st.permutations(output))  # Gemini's order is not the input's
        known = position > 0 and draw(st.booleans())
        members.append((attempt, output, [request(k) for k in sent] if known else None))
    return Lineage(input_lines, members)


def run(
    lineage: Lineage, window: int | None, cap: int = CAP, size: int = 7
) -> tuple[bytes, FinalLedger, list[Reads]]:
    reads = []
    members = []
    for position, (attempt, output, given_lines) in enumerate(lineage.members):
        reads.append(Reads(b"".join(x + b"\n" for x in output), size))
        held = b"".join(x + b"\n" for x in given_lines) if given_lines is not None else None
        members.append(
            Member(attempt, f"m{position}", reads[-1], source(held) if held is not None else None)
        )
    out = bytearray()
    data = b"".join(x + b"\n" for x in lineage.input_lines)
    if window is None:  # the default budget
        ledger = write_final(members, source(data), out.extend, cap)
    else:
        ledger = write_final(members, source(data), out.extend, cap, window_bytes=window)
    return bytes(out), ledger, reads


@settings(max_examples=300, deadline=None)
@given(lineages(), st.sampled_from([1, 2, 60, 200, 400, 1 << 20]))
def test_the_final_is_the_reference_in_input_order_for_every_window(
    lineage: Lineage, window: int
) -> None:
    expected, counts = reference(lineage)
    written, ledger, _reads = run(lineage, window)
    assert written == expected
    assert (ledger.total, ledger.answered, ledger.blocked) == (
        counts["total"],
        counts["answered"],
        counts["blocked"],
    )
    assert dict(ledger.failed) == counts["errors"]
    assert ledger.retried == counts["retried"]
    assert (ledger.extra, ledger.foreign, ledger.unreadable) == (
        counts["extra"],
        counts["foreign"],
        counts["unreadable"],
    )
    assert ledger.attempts == len(lineage.members)


def test_a_retried_lineage_is_written_in_input_order_not_grouped_by_attempt() -> None:
    """The failing test of issue 40's point 8 (it failed on 0.6.0's writer, which wrote the
    root's chosen lines, then the child's, then the missing keys)."""
    keys = ["a", "b", "c", "d", "e"]
    root_out = [row("e", "answered", 1), row("b", "e503", 2), row("a", "answered", 3)]
    root_out += [row("d", "e503", 4)]
    child_out = [row("d", "answered", 5), row("b", "answered", 6)]
    lineage = Lineage(
        [request(k) for k in keys],
        [(0, root_out, None), (1, child_out, [request("b"), request("d")])],
    )
    written, ledger, reads = run(lineage, None)
    assert [json.loads(x)["key"] for x in written.splitlines()] == keys
    assert [json.loads(x)["attempt"] for x in written.splitlines()] == [0, 1, 0, 1, 0]
    assert written == reference(lineage)[0]
    assert ledger.failed == {"missing": 1} and ledger.answered == 4
    assert [r.count for r in reads] == [2, 2]  # one window: each output read twice


def sized(key: str, pad: int) -> bytes:
    return compact({"key": key, "response": {"p": "x" * pad}})


def test_one_window_reads_each_output_twice_and_a_tight_budget_reads_once_per_window() -> None:
    """The outputs are read once to choose, then once per window; a window is cut where the
    next key's line, key text and ``ENTRY_BYTES`` would pass the budget (at least one key)."""
    lines = [sized(k, 100) for k in ("a", "b", "c", "d")]
    per_key = len(lines[0]) + 1 + ENTRY_BYTES  # line bytes, a one-character key, the entry
    lineage = Lineage([request(k) for k in "abcd"], [(0, list(reversed(lines)), None)])
    expected = reference(lineage)[0]
    for window, passes in (
        (4 * per_key, 1),
        (4 * per_key - 1, 2),
        (2 * per_key, 2),
        (2 * per_key - 1, 4),
        (per_key, 4),
        (1, 4),
    ):
        written, _ledger, reads = run(lineage, window)
        assert written == expected, window
        assert reads[0].count == 1 + passes, (window, reads[0].count)


def test_a_window_reads_an_output_only_as_far_as_its_last_chosen_line() -> None:
    """A member with no line chosen for a window is not read for it; a member is read up to
    the window's last line of it (an output in input order is read a little further each
    window, never past what the window needs)."""
    root = [sized(k, 10) for k in "abcd"]
    child = [sized("d", 20), sized("stranger", 5)]  # then a key the input lacks
    seen: list[tuple[str, int]] = []

    def counted(name: str, data: bytes) -> Callable[[], Iterable[bytes]]:
        def chunks() -> Iterable[bytes]:
            seen.append((name, 0))
            for at in range(len(data)):
                seen[-1] = (name, at + 1)
                yield data[at : at + 1]

        return chunks

    members = [
        Member(0, "root", counted("root", b"".join(x + b"\n" for x in root))),
        Member(
            1,
            "child",
            counted("child", b"".join(x + b"\n" for x in child)),
            source(request("d") + b"\n"),
        ),
    ]
    lineage = Lineage([request(k) for k in "abcd"], [(0, root, None), (1, child, [request("d")])])
    out = bytearray()
    data = b"".join(request(k) + b"\n" for k in "abcd")
    write_final(members, source(data), out.extend, CAP, window_bytes=1)
    assert bytes(out) == reference(lineage)[0]
    size = [len(x) + 1 for x in root]
    assert (
        seen
        == [
            ("root", sum(size)),  # to choose: every line
            ("child", sum(len(x) + 1 for x in child)),
            ("root", size[0]),  # window a: up to a's line
            ("root", sum(size[:2])),  # window b
            ("root", sum(size[:3])),  # window c; window d: the child, up to d's line
            ("child", len(child[0]) + 1),
        ]
    )


def test_an_output_changed_between_its_reads_never_gives_a_key_another_keys_line() -> None:
    """A bucket writer (THREATS.md, actor c) swaps an archived output between the read that
    chooses and the read that writes: the line now at the chosen place is kept only when it
    still names the key it was chosen for; otherwise the key is written missing, in its place,
    and the swapped-in line never appears under another key."""
    first = b"".join(x + b"\n" for x in (row("a", "answered", 1), row("b", "answered", 2)))
    second = b"".join(x + b"\n" for x in (row("b", "answered", 3), row("a", "answered", 4)))
    given_out = iter([first, second])

    def output() -> Iterable[bytes]:
        return source(next(given_out, second))()

    out = bytearray()
    data = b"".join(request(k) + b"\n" for k in "ab")
    ledger = write_final([Member(0, "root", output)], source(data), out.extend, CAP)
    written = [json.loads(x) for x in bytes(out).splitlines()]
    assert written == [
        {"key": "a", "error": MISSING, "attempt": 0},
        {"key": "b", "error": MISSING, "attempt": 0},
    ]
    assert ledger.failed == {"missing": 2} and ledger.answered == 0
    # unreadable in its place: the same
    given_out = iter([first, b"not json\n" + first.split(b"\n", 1)[1]])
    out.clear()
    write_final([Member(0, "root", output)], source(data), out.extend, CAP)
    assert [json.loads(x).get("error") for x in bytes(out).splitlines()] == [MISSING, None]


def test_the_default_window_is_32_mib_counting_768_bytes_a_key() -> None:
    """The budget docs/retry.md gives, written out (a test reading the constants would follow
    them): two keys whose chosen lines, one-character keys and 768 bytes each add up to exactly
    32 MiB are one window; one byte more, two."""
    budget = 32 * 1024 * 1024
    for extra, passes in ((0, 1), (1, 2)):
        first = sized("a", 1000)
        pad = budget - (len(first) + 1 + 768) - (len(sized("b", 0)) + 1 + 768) + extra
        lineage = Lineage([request("a"), request("b")], [(0, [sized("b", pad), first], None)])
        written, _ledger, reads = run(lineage, None, cap=budget, size=1 << 20)
        assert len(written) == len(first) + len(sized("b", pad)) + 2 * len(b',"attempt":0}\n') - 2
        assert reads[0].count == 1 + passes, extra


def test_a_window_counts_each_key_its_line_its_key_and_768_bytes() -> None:
    """The cut, exactly: a key counts its chosen line's bytes (also when that line is the first
    line of the root and a failure), its key's characters and 768 bytes; a key with no line,
    its key and 768 bytes. Seen through the input's reads: once for the index, once a window."""
    failure, answer = row("a", "e503", 1), row("b", "answered", 2)
    lineage = Lineage([request(k) for k in "abc"], [(0, [failure, answer], None)])
    costs = [len(failure) + 1 + 768, len(answer) + 1 + 768, 1 + 768]  # c: no line
    for budget, windows in ((sum(costs), 1), (sum(costs) - 1, 2)):
        members = [Member(0, "root", source(b"".join(x + b"\n" for x in lineage.members[0][1])))]
        reads = Reads(b"".join(x + b"\n" for x in lineage.input_lines))
        out = bytearray()
        write_final(members, reads, out.extend, CAP, window_bytes=budget)
        assert bytes(out) == reference(lineage)[0]
        assert reads.count == 1 + windows, budget
