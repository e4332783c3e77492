"""The retry pass's memory bound (issue 39), measured with tracemalloc on smaller sizes than the
benchmark's (``benchmarks/bench_retry_memory.py``: 32 MiB lines, 1 M keys): what a pass adds
reading a long input line, a long output row and many long keys stays a small multiple of the
longest line, never of what the line parses into (a line of small parts is ~19 times its size
as Python objects) nor of the keys' text.

Every stream here yields new chunks of about 1 MiB as it is read (cut then, or copied from chunks
made before tracemalloc starts), so what tracemalloc sees is the readers' own memory."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable, Iterator

from opstate.retry.final import WINDOW_BYTES, Member, write_final
from opstate.retry.inputs import check_input, keys_cover, subset
from opstate.retry.rules import DEFAULT_TABLE, lines, reason_history, transient_failures

CAP = 32 * 1024 * 1024
MIB = 1024 * 1024
LINE_BYTES = 4 * MIB
PART = b'{"text":"w"},'


def parts_list(size: int) -> bytes:
    """A JSON list of small parts about ``size`` bytes long."""
    count = size // len(PART)
    return b"[" + PART * (count - 1) + PART[:-1] + b"]"


def stream(data: list[bytes]) -> Callable[[], Iterator[bytes]]:
    """Chunks of about 1 MiB of the lines ``data`` (each ends with a newline), cut anywhere."""

    def chunks() -> Iterator[bytes]:
        for line in data:
            for at in range(0, len(line), MIB):
                yield line[at : at + MIB]

    return chunks


# Enough 512-character keys that their text alone, as Python strings (561 bytes each), is more
# than the many-keys test allows with a 1 MiB window (LONG_KEYS_BOUND): 10,000 keys hold
# 5.35 MiB, so a pass that keeps every key's text fails the bound even before its own ~3 MiB
# (measured: 2.95 MiB with a 1 MiB window). More keys only cost time: the final's 1 MiB windows
# read the streams again, so time grows with the square of the count (12,000 keys and a 6 MiB
# bound, the same margins, took twice the CPU; 20,000 keys took 28 s).
LONG_KEYS = 10_000
LONG_KEYS_BOUND = 5 * MIB


def generated(count: int, line: Callable[[str], bytes]) -> Callable[[], Iterator[bytes]]:
    """``count`` lines with 512-character keys, in chunks of about 1 MiB. The chunks are made
    once, before tracemalloc starts, and each read yields a new copy of each (as a file or S3
    body read would): a reader holding on to what it read is still counted, and the lines'
    making, repeated for every window's read, no longer costs the test most of its time."""
    made: list[bytes] = []
    held: list[bytes] = []
    size = 0
    for index in range(count):
        held.append(line(f"{index:08d}".ljust(512, "k")))
        size += len(held[-1])
        if size >= MIB:
            made.append(b"".join(held))
            held, size = [], 0
    if held:
        made.append(b"".join(held))

    def chunks() -> Iterator[bytes]:
        for chunk in made:
            yield memoryview(chunk).tobytes()

    return chunks


def request(key: str) -> bytes:
    return json.dumps({"key": key, "request": {"contents": []}}).encode() + b"\n"


def answer(key: str) -> bytes:
    return json.dumps({"key": key, "response": {"candidates": [{"content": {}}]}}).encode() + b"\n"


def unavailable(key: str) -> bytes:
    return json.dumps({"key": key, "error": {"code": 503, "message": "later"}}).encode() + b"\n"


def peak_added(work: Callable[[], object]) -> int:
    """The most memory ``work`` held at once beyond what was held before (bytes)."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


def test_a_long_input_line_is_checked_covered_and_cut_in_about_its_own_size() -> None:
    big = b'{"key":"big","request":{"contents":[{"parts":' + parts_list(LINE_BYTES) + b"}]}}\n"
    source = stream([request("a"), big, request("b")])
    output = stream([answer("a"), unavailable("big"), answer("b")])

    def work() -> None:
        assert check_input(source(), CAP).rows == 3
        assert keys_cover(source, output, CAP) == 0
        failed = transient_failures(lines(output(), CAP, skip_long=True), DEFAULT_TABLE)
        assert failed == {"big": "UNAVAILABLE"}
        (picked,) = subset(source(), set(failed), CAP)
        assert picked[1] == big[:-1]
        del picked
        ledger = write_final([Member(0, "batches/r", output)], source, lambda _: None, CAP)
        assert ledger.as_dict()["rows"]["failed"] == 1

    assert peak_added(work) < 2.5 * LINE_BYTES


def test_a_long_output_row_is_chosen_and_written_in_about_its_own_size() -> None:
    big = (
        b'{"key":"big","response":{"candidates":[{"content":{"parts":'
        + parts_list(LINE_BYTES)
        + b'},"finishReason":"STOP"}]}}\n'
    )
    source = stream([request("a"), request("big")])
    output = stream([unavailable("a"), big])
    out: list[int] = []

    def work() -> None:
        assert keys_cover(source, output, CAP) == 0
        failed = transient_failures(lines(output(), CAP, skip_long=True), DEFAULT_TABLE)
        assert failed == {"a": "UNAVAILABLE"}
        reason_history(lines(output(), CAP, skip_long=True), set(failed), DEFAULT_TABLE)
        write = lambda data: out.append(len(data))  # noqa: E731
        ledger = write_final([Member(0, "batches/r", output)], source, write, CAP)
        assert ledger.as_dict()["rows"] == {"total": 2, "answered": 1, "blocked": 0, "failed": 1}

    assert peak_added(work) < 2.5 * LINE_BYTES
    assert sum(out) == len(big) + len(b',"attempt":0') + len(unavailable("a")) + len(
        b',"attempt":0'
    )


def fast_request(key: str) -> bytes:
    return b'{"key":"%s","request":{}}\n' % key.encode()


def fast_answer(key: str) -> bytes:
    return b'{"key":"%s","response":{"candidates":[{"content":{}}]}}\n' % key.encode()


def test_many_long_keys_are_held_as_digests_never_as_text() -> None:
    count = LONG_KEYS
    source = generated(count, fast_request)
    output = generated(count, fast_answer)
    written: list[int] = [0]

    def write(data: bytes) -> None:
        written[0] += 1

    def work(window: int) -> Callable[[], None]:
        def run() -> None:
            assert check_input(source(), CAP).rows == count
            assert keys_cover(source, output, CAP) == 0
            members = [Member(0, "batches/r", output)]
            ledger = write_final(members, source, write, CAP, window_bytes=window)
            assert ledger.total == count and ledger.answered == count

        return run

    # 8-byte digests (16 while they are sorted) and a byte or two a key, plus the final's window
    # (the chosen lines and key texts of a run of keys in input order, counted with
    # ENTRY_BYTES a key): well under the keys' own text (LONG_KEYS) with a 1 MiB window, and
    # the default window's 32 MiB is a bound, not a size
    assert peak_added(work(MIB)) < LONG_KEYS_BOUND
    assert peak_added(work(WINDOW_BYTES)) < WINDOW_BYTES + LONG_KEYS_BOUND
    assert written[0] > 0
