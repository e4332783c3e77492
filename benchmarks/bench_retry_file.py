"""Building a retry batch's input from a large batch: time and memory of the retry engine's file
work, next to a plain line split of the same bytes.

Setup: a ``--rows`` (default 100,000) batch output, ``--transient`` (default 5 %) of its rows
failed transiently (503, 429 without a quota message, 500, 504 in turn) and 1 % permanently
(400), the rest answered, and its input of the same keys: requests and answers of
``--text`` characters (default 1,200: lines of about 1.3-1.5 KB), written to files first.
In a fresh process, from files (1 MiB chunks), the engine's steps for attempt 1:

1. ``transient_failures`` over the output (which keys failed transiently, and why);
2. ``reason_history`` over the output for those keys, then ``select_retry`` (the default
   table, ``maxAttempts`` 2);
3. ``subset`` of the input for the chosen keys, written through a ``FileSink`` (temporary name,
   fsync, rename), as the child's ``.jsonl``.

The reference, in another fresh process: ``rules.lines`` over both files (the split alone, no
JSON). Peak RSS added = the process's high-water mark (``VmHWM``) after the steps minus its RSS
just before them (after every import; the mark is reset there through ``/proc/self/clear_refs``).
Not ``resource.getrusage``'s ``ru_maxrss``: Linux carries it across ``execve``, so a child of
``run.py`` reported its parent's size and 0 added. Target: peak RSS added <= 64 MiB.
``--rounds`` (default 3) alternates the two and keeps each one's fastest.

Run: ``.venv/bin/python benchmarks/bench_retry_file.py [--rows 100000] [--transient 0.05]
[--text 1200] [--rounds 3] [--dir DIR] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
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
TRANSIENT_ERRORS = [
    {"code": 503, "message": "The service is currently unavailable.", "status": "UNAVAILABLE"},
    {"code": 429, "message": "Resource has been exhausted.", "status": "RESOURCE_EXHAUSTED"},
    {"code": 500, "message": "An internal error has occurred.", "status": "INTERNAL"},
    {"code": 504, "message": "Deadline exceeded.", "status": "DEADLINE_EXCEEDED"},
]
PERMANENT_ERROR = {"code": 400, "message": "Request contains an invalid argument."}
WORDS = [
    "the",
    "batch",
    "answer",
    "holds",
    "some",
    "words",
    "of",
    "a",
    "plausible",
    "length",
    "for",
    "a",
    "model",
    "reply",
]


def _text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


def generate(directory: Path, rows: int, transient: float, text: int) -> dict[str, int]:
    """Write ``input.jsonl`` and ``output.jsonl``; the counts of the output's rows."""
    rng = random.Random(33)
    counts = {"transient": 0, "permanent": 0, "answered": 0}
    with (
        (directory / "input.jsonl").open("w", encoding="utf-8") as inp,
        (directory / "output.jsonl").open("w", encoding="utf-8") as out,
    ):
        for i in range(rows):
            key = f"request-{i:07d}"
            request = {
                "contents": [{"role": "user", "parts": [{"text": _text(rng, text)}]}],
                "generationConfig": {"temperature": 0.2, "maxOutputTokens": 1024},
            }
            inp.write(json.dumps({"key": key, "request": request}) + "\n")
            draw = rng.random()
            row: dict[str, Any]
            if draw < transient:
                row = {"key": key, "error": TRANSIENT_ERRORS[counts["transient"] % 4]}
                counts["transient"] += 1
            elif draw < transient + 0.01:
                row = {"key": key, "error": PERMANENT_ERROR}
                counts["permanent"] += 1
            else:
                answer = {"parts": [{"text": _text(rng, text)}], "role": "model"}
                row = {
                    "key": key,
                    "response": {
                        "candidates": [{"content": answer, "finishReason": "STOP", "index": 0}],
                        "usageMetadata": {
                            "promptTokenCount": text // 4,
                            "candidatesTokenCount": text // 4,
                            "totalTokenCount": text // 2,
                        },
                        "modelVersion": "gemini-2.5-flash",
                    },
                }
                counts["answered"] += 1
            out.write(json.dumps(row) + "\n")
    return counts


def _chunks(path: Path) -> Any:
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


def _rss_start() -> int:
    """The resident size now (KiB), the high-water mark reset to it where Linux allows it
    (``/proc/self/clear_refs`` 5), so the peak measured is the steps' own, not the imports'."""
    # without it VmHWM may include an earlier peak: the figure errs on the high side
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return status_kib("VmRSS")


def _peak_kib() -> int:
    """The high-water mark of the resident size (KiB). Not ``ru_maxrss``: Linux keeps that
    across ``execve``, so a child forked from a bigger process (``run.py``) would report its
    parent's size and nothing added."""
    return status_kib("VmHWM")


def _retry(directory: Path) -> dict[str, Any]:
    from opstate.outcomes.file_sink import FileSink
    from opstate.retry.inputs import subset
    from opstate.retry.rules import (
        DEFAULT_TABLE,
        lines,
        reason_history,
        select_retry,
        transient_failures,
    )

    output, inp = directory / "output.jsonl", directory / "input.jsonl"
    sink = FileSink(directory / "sink")
    before = _rss_start()
    start = time.perf_counter()
    candidates = transient_failures(lines(_chunks(output), MAX_LINE_BYTES), DEFAULT_TABLE)
    found = time.perf_counter()
    history = reason_history(lines(_chunks(output), MAX_LINE_BYTES), set(candidates), DEFAULT_TABLE)
    chosen = select_retry(candidates, history, DEFAULT_TABLE, 1, 2)
    selected = time.perf_counter()
    written = 0
    with sink.open("retry/child.jsonl", name="batches/bench") as writer:
        for _key, line in subset(_chunks(inp), chosen, MAX_LINE_BYTES):
            writer.write(line + b"\n")
            written += 1
        stored = writer.commit("")
    end = time.perf_counter()
    return {
        "seconds": end - start,
        "transient_failures_s": found - start,
        "history_and_select_s": selected - found,
        "subset_s": end - selected,
        "rss_added_kib": _peak_kib() - before,
        "candidates": len(candidates),
        "chosen": len(chosen),
        "written": written,
        "child_bytes": stored.size,
        "bytes_read": 2 * output.stat().st_size + inp.stat().st_size,
    }


def _split(directory: Path) -> dict[str, Any]:
    from opstate.retry.rules import lines

    output, inp = directory / "output.jsonl", directory / "input.jsonl"
    before = _rss_start()
    start = time.perf_counter()
    count = 0
    for path in (output, output, inp):  # the same bytes the steps read
        for _line in lines(_chunks(path), MAX_LINE_BYTES):
            count += 1
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "lines": count, "rss_added_kib": _peak_kib() - before}


def child(mode: str, directory: str) -> None:
    out = _retry(Path(directory)) if mode == "retry" else _split(Path(directory))
    print(json.dumps(out))


def _run_child(mode: str, directory: Path) -> dict[str, Any]:
    return run_child(__file__, mode, str(directory))


def measure(
    rows: int = 100_000,
    rounds: int = 3,
    transient: float = 0.05,
    text: int = 1200,
    directory: str | None = None,
) -> dict[str, Any]:
    best: dict[str, dict[str, Any]] = {}
    peak_kib = 0
    with tempfile.TemporaryDirectory(dir=directory, prefix="opstate-bench-retry-") as tmp:
        where = Path(tmp)
        counts = generate(where, rows, transient, text)
        input_bytes = (where / "input.jsonl").stat().st_size
        output_bytes = (where / "output.jsonl").stat().st_size
        for _ in range(rounds):
            for mode in ("split", "retry"):
                got = _run_child(mode, where)
                if mode == "retry":
                    peak_kib = max(peak_kib, got["rss_added_kib"])
                if mode not in best or got["seconds"] < best[mode]["seconds"]:
                    best[mode] = got
    retry, split = best["retry"], best["split"]
    # every transient failure is retried on attempt 1 under the default table
    assert retry["chosen"] == retry["written"] == counts["transient"], (retry, counts)
    mib = retry["bytes_read"] / 2**20
    return {
        "rows": rows,
        "transient_rows": counts["transient"],
        "permanent_rows": counts["permanent"],
        "input_mib": round(input_bytes / 2**20, 1),
        "output_mib": round(output_bytes / 2**20, 1),
        "input_line_bytes": input_bytes // rows,
        "output_line_bytes": output_bytes // rows,
        "retry_s": round(retry["seconds"], 3),
        "transient_failures_s": round(retry["transient_failures_s"], 3),
        "history_and_select_s": round(retry["history_and_select_s"], 3),
        "subset_s": round(retry["subset_s"], 3),
        "retry_mib_s": round(mib / retry["seconds"], 1),
        "split_s": round(split["seconds"], 3),
        "split_mib_s": round(mib / split["seconds"], 1),
        "child_rows": retry["written"],
        "child_mib": round(retry["child_bytes"] / 2**20, 2),
        # the highest of all rounds, not the fastest round's
        "retry_rss_added_mib": round(peak_kib / 1024, 1),
        "split_rss_added_mib": round(split["rss_added_kib"] / 1024, 1),
        "rounds": rounds,
        "targets": {"rss_added_mib": RSS_TARGET_MIB},
        "ok": peak_kib / 1024 <= RSS_TARGET_MIB,
    }


def table_rows(got: dict[str, Any], row: Callable[[str, Any, Any, Any, str], None]) -> None:
    """``run.py``'s table rows of a ``measure`` result (none when it did not run)."""
    if "retry_s" not in got:
        return
    label = f"retry file {got['rows']:,} rows ({got['transient_rows']:,} transient)"
    row(
        f"{label}: MiB/s vs the line split alone",
        got["retry_mib_s"],
        got["split_mib_s"],
        round(got["retry_mib_s"] / got["split_mib_s"], 3),
        "",
    )
    ok = "ok" if got["ok"] else "MISSED"
    row(
        f"{label}: peak RSS added (MiB)",
        got["retry_rss_added_mib"],
        got["split_rss_added_mib"],
        "",
        f"<= {RSS_TARGET_MIB} {ok}",
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--transient", type=float, default=0.05)
    parser.add_argument("--text", type=int, default=1200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", help="where the files are written (default: the temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.rows, args.rounds, args.transient, args.text, args.dir)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key:24} {value}")


if __name__ == "__main__":
    main()
