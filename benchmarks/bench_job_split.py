"""A job's split, measured (issue 46): the memory a submit adds while it cuts a 1 M-line, 1 GB
input into parts and plans them (``opstate.domain.parts.split_lines`` over the input's lines
as ``opstate.retry.feeding.lines_of`` reads them from 1 MiB chunks, then
``opstate.retry.jobs.new_plan``), and how long that takes.

The input is generated as it streams (never held): ``--lines`` request lines of ``--bytes``
bytes each (default 1,000,000 x 1,074 = 1 GiB), cut under Gemini 2.5 Flash's Tier-1 cap (3 M
tokens by opstate's estimate), 2 GB files and 50,000 rows a part. Peak RSS added = the
process's high-water mark (``VmHWM``) after the split minus its RSS just before (the mark reset
through ``/proc/self/clear_refs``), in a fresh interpreter. Target: <= 64 MiB.

Run: ``.venv/bin/python benchmarks/bench_job_split.py [--lines N] [--bytes B] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for entry in (str(ROOT), str(ROOT / "layers" / "opstate")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from bench_archive import run_child, status_kib  # noqa: E402

CHUNK = 1024 * 1024


def generated(lines: int, size: int) -> Iterator[bytes]:
    """``lines`` JSONL request lines of ``size`` bytes each, in 1 MiB chunks."""
    pending: list[bytes] = []
    held = 0
    for i in range(lines):
        head = b'{"key":"k%d","request":{"contents":[{"parts":[{"text":"' % i
        tail = b'"}]}]}}\n'
        line = head + b"x" * max(0, size - len(head) - len(tail)) + tail
        pending.append(line)
        held += len(line)
        if held >= CHUNK:
            yield b"".join(pending)
            pending, held = [], 0
    if pending:
        yield b"".join(pending)


def child(lines: int, size: int) -> dict[str, Any]:
    from opstate.config import DEFAULT_SUBMIT_MAX_FILE_BYTES, DEFAULT_SUBMIT_MAX_ROWS
    from opstate.domain.parts import Bounds, split_lines
    from opstate.retry import jobs
    from opstate.retry.feeding import lines_of

    Path("/proc/self/clear_refs").write_text("5")
    before = status_kib("VmRSS")
    start = time.perf_counter()
    bounds = Bounds(3_000_000, DEFAULT_SUBMIT_MAX_FILE_BYTES, DEFAULT_SUBMIT_MAX_ROWS)
    parts = split_lines(lines_of(generated(lines, size)), bounds)
    plan = jobs.new_plan(jobs.new_job_id(), "gemini-2.5-flash", {}, parts)
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM")
    total = plan["parts"][-1]["end"]
    return {
        "lines": lines,
        "bytes": total,
        "parts": len(plan["parts"]),
        "seconds": round(seconds, 1),
        "peak_added_mib": round((peak - before) / 1024, 1),
        "plan_json_kib": round(len(json.dumps(plan)) / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--bytes", type=int, default=1074)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("LINES", "BYTES"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), int(args.child[1]))))
        return
    result = run_child(__file__, str(args.lines), str(args.bytes))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>16}: {value}")


if __name__ == "__main__":
    main()
