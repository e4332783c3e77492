"""The retry pass's peak memory on its hardest legal inputs (issue 39): one 32 MiB input line,
one 32 MiB output row, and an input of 1 M keys of 512 characters.

Each case runs in a fresh interpreter, on the functions a retry pass runs over a lineage's
bytes, in the pass's order, chunks of 1 MiB as the sinks give them:

- ``input_line``: an input of 4 requests, one of them a legal line just under the 32 MiB cap
  (a request of ~2.6 M small parts: the shape that costs most once parsed), and an output
  whose row for that key failed 503: ``keep_input`` (check, then copy into a folder sink),
  ``keys_cover``, ``transient_failures`` + ``reason_history`` (the keys to retry), ``subset``
  into the child's file, ``write_final``;
- ``output_row``: an input of 4 requests and an output where one answer is a 32 MiB row (one
  candidate of ~2.6 M small parts), the rest failed 503: ``keys_cover``, ``transient_failures``
  + ``reason_history``, ``write_final``;
- ``keys``: an input of 1,000,000 requests whose keys are 512 characters, and an output
  answering each (both generated as they stream, never held, ~560 MiB and ~640 MiB):
  ``check_input`` (``keep_input``'s first pass; its copy streams), ``keys_cover``,
  ``transient_failures``, ``write_final`` (its lines counted, not kept);
- ``failed_keys``: the same input, and an output where every request failed 503: the keys to
  retry (``selection.select_keys`` over the input's key digests; on the code before it, the
  rules' ``transient_failures`` + ``reason_history`` + ``select_retry`` over key texts), the
  children's lines cut by ``subset`` (counted, not written), ``write_final``.

Peak RSS added = the process's high-water mark (``VmHWM``) after the steps minus its RSS just
before them (after every import and after the small files are written; the mark is reset there
through ``/proc/self/clear_refs``), as in ``bench_retry_file.py``. Target: <= 64 MiB each.

Run: ``.venv/bin/python benchmarks/bench_retry_memory.py [--keys 1000000] [--case NAME ...]
[--dir DIR] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for entry in (str(ROOT), str(ROOT / "layers" / "opstate")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from bench_archive import run_child, status_kib  # noqa: E402

RSS_TARGET_MIB = 64
CHUNK = 1024 * 1024
MAX_LINE_BYTES = 32 * 1024 * 1024
KEY_CHARS = 512
CASES = ("input_line", "output_row", "keys", "failed_keys")
UNAVAILABLE = {"code": 503, "message": "The service is currently unavailable.", "status": "x"}
PART = b'{"text":"w"},'


def _big_parts(prefix: bytes, suffix: bytes) -> bytes:
    """``prefix`` + a JSON list of small parts + ``suffix``, just under ``MAX_LINE_BYTES``."""
    count = (MAX_LINE_BYTES - len(prefix) - len(suffix) - 64) // len(PART)
    return prefix + b"[" + PART * (count - 1) + PART[:-1] + b"]" + suffix


def _line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


def _request(key: str) -> bytes:
    return _line({"key": key, "request": {"contents": [{"parts": [{"text": f"q {key}"}]}]}})


def _answer(key: str) -> bytes:
    content = {"parts": [{"text": "a"}]}
    return _line({"key": key, "response": {"candidates": [{"content": content}]}})


def _failed(key: str) -> bytes:
    return _line({"key": key, "error": UNAVAILABLE})


def _write_files(case: str, where: Path) -> tuple[Path, Path]:
    small = [f"k{i}" for i in range(3)]
    if case == "input_line":
        big = _big_parts(b'{"key":"big","request":{"contents":[{"parts":', b"}]}}\n")
        data = b"".join(_request(k) for k in small) + big
        out = b"".join(_answer(k) for k in small) + _failed("big")
    else:
        data = b"".join(_request(k) for k in [*small, "big"])
        big = _big_parts(b'{"key":"big","response":{"candidates":[{"content":{"parts":', b"}}]}}\n")
        out = b"".join(_failed(k) for k in small) + big
    (where / "input.jsonl").write_bytes(data)
    (where / "output.jsonl").write_bytes(out)
    return where / "input.jsonl", where / "output.jsonl"


def _file(path: Path) -> Callable[[], Iterator[bytes]]:
    def chunks() -> Iterator[bytes]:
        with path.open("rb") as handle:
            while chunk := handle.read(CHUNK):
                yield chunk

    return chunks


def _generated(count: int, line: Callable[[str], bytes]) -> Callable[[], Iterator[bytes]]:
    """``count`` lines of keys of ``KEY_CHARS`` characters, in chunks of about 1 MiB, made as
    they stream (never held)."""

    def chunks() -> Iterator[bytes]:
        held: list[bytes] = []
        size = 0
        for index in range(count):
            key = f"{index:012d}".ljust(KEY_CHARS, "k")
            held.append(line(key))
            size += len(held[-1])
            if size >= CHUNK:
                yield b"".join(held)
                held, size = [], 0
        if held:
            yield b"".join(held)

    return chunks


def _rss_start() -> int:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return status_kib("VmRSS")


def child(case: str, keys: int, directory: str) -> None:
    from opstate.outcomes.file_sink import FileSink
    from opstate.retry.final import Member, write_final
    from opstate.retry.inputs import check_input, keep_input, keys_cover, subset
    from opstate.retry.rules import DEFAULT_TABLE, lines, reason_history, transient_failures

    where = Path(directory)
    sink = FileSink(where / "sink")
    written = 0

    def write(data: bytes) -> None:
        nonlocal written
        written += len(data)

    if case == "keys":
        source, output = _generated(keys, _request), _generated(keys, _answer)
    elif case == "failed_keys":
        source, output = _generated(keys, _request), _generated(keys, _failed)
    else:
        input_path, output_path = _write_files(case, where)
        source, output = _file(input_path), _file(output_path)
    before = _rss_start()
    started = time.perf_counter()
    if case == "input_line":
        kept = keep_input(source, sink, MAX_LINE_BYTES).location
        source = lambda: sink.chunks(kept)  # noqa: E731
    elif case in ("keys", "failed_keys"):
        check_input(source(), MAX_LINE_BYTES)
    missing = keys_cover(source, output, MAX_LINE_BYTES)
    if case == "failed_keys":
        chosen = _select(source, output)
        picked = sum(1 for _ in subset(source(), chosen, MAX_LINE_BYTES))
        del chosen
        ledger = write_final([Member(0, "batches/bench", output)], source, write, MAX_LINE_BYTES)
        _report(case, before, started, missing, picked, 0, written, ledger.as_dict()["rows"])
        return
    failed = transient_failures(lines(output(), MAX_LINE_BYTES, skip_long=True), DEFAULT_TABLE)
    if failed and case != "keys":
        reason_history(lines(output(), MAX_LINE_BYTES, skip_long=True), set(failed), DEFAULT_TABLE)
    child_bytes = 0
    if case == "input_line":
        with sink.open("retry/child.jsonl", name="batches/bench") as out:
            for _key, line in subset(source(), set(failed), MAX_LINE_BYTES):
                out.write(line)  # as cutting._put: the line and its newline apart
                out.write(b"\n")
                child_bytes += len(line) + 1
                del line  # as cutting._split: a written line is let go
            out.commit("0" * 64)
    ledger = write_final([Member(0, "batches/bench", output)], source, write, MAX_LINE_BYTES)
    rows = ledger.as_dict()["rows"]
    _report(case, before, started, missing, len(failed), child_bytes, written, rows)


def _select(source: Callable[[], Iterator[bytes]], output: Callable[[], Iterator[bytes]]) -> Any:
    """The keys attempt 1 retries, as the pass at hand chooses them."""
    from opstate.retry.rules import DEFAULT_TABLE, lines

    def latest() -> Iterator[bytes]:
        return lines(output(), MAX_LINE_BYTES, skip_long=True)

    try:
        from opstate.retry.reading import KeyIndex, key_of
        from opstate.retry.selection import select_keys
    except ImportError:  # the code before issue 39: the rules over key texts
        from opstate.retry.rules import reason_history, select_retry, transient_failures

        failed = transient_failures(latest(), DEFAULT_TABLE)
        history = reason_history(latest(), set(failed), DEFAULT_TABLE)
        return select_retry(failed, history, DEFAULT_TABLE, 1, 1)
    keys = (key_of(line) for line in lines(source(), MAX_LINE_BYTES, skip_long=True))
    index = KeyIndex(key for key in keys if key is not None)
    return select_keys(index, latest, [latest], DEFAULT_TABLE, 1, 1)


def _report(
    case: str,
    before: int,
    started: float,
    missing: int,
    retried: int,
    child_bytes: int,
    written: int,
    rows: Any,
) -> None:
    seconds = time.perf_counter() - started
    peak = status_kib("VmHWM")
    print(
        json.dumps(
            {
                "case": case,
                "rss_added_kib": peak - before,
                "seconds": round(seconds, 2),
                "missing": missing,
                "retried_keys": retried,
                "child_bytes": child_bytes,
                "final_bytes": written,
                "final_rows": rows,
            }
        )
    )


def measure(
    cases: tuple[str, ...] = CASES, keys: int = 1_000_000, directory: str | None = None
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for case in cases:
        with tempfile.TemporaryDirectory(dir=directory) as where:
            got = run_child(__file__, case, str(keys), where)
        got["rss_added_mib"] = round(got.pop("rss_added_kib") / 1024, 1)
        got["within_target"] = got["rss_added_mib"] <= RSS_TARGET_MIB
        results[case] = got
    return results


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--case", action="append", choices=CASES)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = measure(tuple(args.case or CASES), args.keys, args.dir)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for case, got in results.items():
        mark = "ok" if got["within_target"] else f"OVER {RSS_TARGET_MIB} MiB"
        added = got["rss_added_mib"]
        print(f"{case:<11} peak RSS added {added:>7} MiB  {got['seconds']:>7} s  {mark}")


if __name__ == "__main__":
    main()
