"""Archiving a large batch output: memory and throughput of the copy, side by side with a plain
streaming copy of the same bytes.

Setup (the issue's measurement): the fake Gemini server (``tests/support/fake_gemini.py``)
serves a ``--mib`` (default 1024) batch output generated on the fly (never held whole), rows of
``--text`` characters of answer each (default 3000, about a 600-token answer; the ledger's cost
is per row, so shorter rows cost more per byte: ``--text 900`` shows it). Each
measurement runs in its own fresh process, so its memory is its own:

- plain: the same bytes through httpx (``client.stream`` + ``iter_bytes(1 MiB)``) into a file
  (httpx2, the drop-in fork the SDK itself runs on, where httpx is not installed);
- archive: one ``archive_once`` pass on a memory store with the real google-genai client
  (``files.download`` into the ledger and the folder sink: temporary name, fsync, rename);
- ledger: the ledger alone over the same chunks already in memory (its CPU cost, no I/O),
  the way the archiver runs it (msgspec) and the stdlib way (``use_msgspec=False``, what it
  falls back to without msgspec).

Peak RSS added by the copy = the process's high-water mark (``VmHWM``) minus its RSS just
before the copy (after every import). Targets: archive RSS added <= 64 MiB; archive throughput
>= 0.8x plain. ``--rounds`` (default 3) alternates plain and archive and keeps each one's best:
on a shared machine one round of either can be slowed by a neighbour, and the plain copy of a
file larger than the page cache's dirty limit by write-back.

Both copies end with an fsync, so a slow disk slows both (the archive less: its writes overlap
the download); ``--dir /dev/shm`` writes to memory and leaves the CPU cost alone.

Run: ``.venv/bin/python benchmarks/bench_archive.py [--mib 1024] [--rounds 3] [--text 3000]
[--dir DIR] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for entry in (str(ROOT), str(ROOT / "layers" / "opstate")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

RSS_TARGET_MIB = 64
RATIO_TARGET = 0.8
KEY = "bench-key"


def status_kib(field: str) -> int:
    """A field of ``/proc/self/status`` in KiB (``VmRSS``, ``VmHWM``); 0 when absent."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _httpx() -> Any:
    """httpx, or httpx2 (the drop-in fork google-genai 3.6 runs on when httpx is absent)."""
    import importlib

    try:
        return importlib.import_module("httpx")
    except ImportError:
        return importlib.import_module("httpx2")


def _plain(url: str, dest: Path) -> dict[str, Any]:
    httpx = _httpx()

    with httpx.Client(timeout=60) as client:
        before = status_kib("VmRSS")
        start = time.perf_counter()
        size = 0
        with client.stream("GET", url, headers={"x-goog-api-key": KEY}) as response:
            response.raise_for_status()
            with dest.open("wb") as out:
                for chunk in response.iter_bytes(1024 * 1024):
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
        seconds = time.perf_counter() - start
    return {"bytes": size, "seconds": seconds, "rss_added_kib": status_kib("VmHWM") - before}


def _archive(base_url: str, dest: Path) -> dict[str, Any]:
    os.environ["GOOGLE_GEMINI_BASE_URL"] = base_url
    from opstate.config import Settings
    from opstate.domain.model import OpEvent
    from opstate.domain.states import State
    from opstate.ingest import ingest
    from opstate.outcomes.file_sink import FileSink
    from opstate.outcomes.genai_source import GenaiSource, make_client
    from opstate.outcomes.run import archive_once
    from opstate.store import MemoryStore

    store = MemoryStore()
    now = time.time_ns()
    ingest(store, OpEvent("batches/big", State.SUCCEEDED, now, "poll", {}), clock_ns=lambda: now)
    source = GenaiSource(make_client(Settings(gemini_api_key=KEY, results_http_timeout_s=60)))
    sink = FileSink(dest)
    before = status_kib("VmRSS")
    start = time.perf_counter()
    result = archive_once(store, source, sink, settings=Settings())
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM")
    source.close()
    state = store.get_archive("batches/big")
    assert result.archived == 1 and state is not None, result
    summary = dict(state.summary)
    return {
        "bytes": result.bytes,
        "seconds": seconds,
        "rss_added_kib": peak - before,
        "rows": summary["rows"],
        "sha256": summary["objects"][0]["sha256"],
    }


def _ledger(mib: int, text: int, use_msgspec: bool) -> dict[str, Any]:
    from opstate.outcomes.ledger import BatchLedger
    from tests.support.outcomes import generated_output

    chunks, size, _rows = generated_output(mib * 1024 * 1024, text)
    pieces = list(zip(range(64), chunks(), strict=False))  # 64 MiB in memory, fed in a loop
    block = [p for _, p in pieces]
    ledger = BatchLedger(use_msgspec=use_msgspec)
    start = time.perf_counter()
    fed = 0
    while fed < size:
        for piece in block:
            ledger.feed(piece)
            fed += len(piece)
            if fed >= size:
                break
    ledger.finish()
    seconds = time.perf_counter() - start
    return {"bytes": fed, "seconds": seconds, "rows": ledger.rows.as_dict()}


def child(mode: str, arg: str, dest: str) -> None:
    if mode == "plain":
        out = _plain(arg, Path(dest))
    elif mode == "archive":
        out = _archive(arg, Path(dest))
    else:
        mib, text, way = arg.split(":")
        out = _ledger(int(mib), int(text), way == "msgspec")
    print(json.dumps(out))


def run_child(script: str, *args: str) -> dict[str, Any]:
    """Run ``script --child ARGS...`` in a fresh interpreter; the JSON its last line prints."""
    done = subprocess.run(
        [sys.executable, script, "--child", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _run_child(mode: str, arg: str, dest: Path) -> dict[str, Any]:
    return run_child(__file__, mode, arg, str(dest))


def measure(
    mib: int = 1024, rounds: int = 3, text: int = 3000, directory: str | None = None
) -> dict[str, Any]:
    from tests.support.fake_gemini import FakeGemini
    from tests.support.outcomes import generated_output

    chunks, size, rows = generated_output(mib * 1024 * 1024, text)
    best: dict[str, dict[str, Any]] = {}
    with FakeGemini() as fake, tempfile.TemporaryDirectory(dir=directory) as tmp:
        fake.api_key = KEY
        name = fake.put_file("big", body=chunks, size=size, expiration_time="2999-01-01T00:00:00Z")
        fake.put_batch("batches/big", "SUCCEEDED", responses_file=name)
        url = f"{fake.base_url}/v1beta/{name}:download?alt=media"
        for _ in range(rounds):
            for mode, arg, dest in (
                ("plain", url, Path(tmp) / "plain.jsonl"),
                ("archive", fake.base_url, Path(tmp) / "results"),
            ):
                got = _run_child(mode, arg, dest)
                if mode not in best or got["seconds"] < best[mode]["seconds"]:
                    best[mode] = got
                if dest.is_file():
                    dest.unlink()
        ledger = _run_child("ledger", f"{mib}:{text}:msgspec", Path(tmp))
        stdlib = _run_child("ledger", f"{mib}:{text}:stdlib", Path(tmp))
    plain, archive = best["plain"], best["archive"]
    plain_mibs = plain["bytes"] / plain["seconds"] / 2**20
    archive_mibs = archive["bytes"] / archive["seconds"] / 2**20
    ledger_mibs = ledger["bytes"] / ledger["seconds"] / 2**20
    stdlib_mibs = stdlib["bytes"] / stdlib["seconds"] / 2**20
    assert archive["bytes"] == plain["bytes"] == size
    assert archive["rows"]["succeeded"] == rows
    return {
        "mib": round(size / 2**20, 1),
        "rows": rows,
        "row_bytes": size // rows,
        "plain_mib_s": round(plain_mibs, 1),
        "archive_mib_s": round(archive_mibs, 1),
        "ratio": round(archive_mibs / plain_mibs, 3),
        "plain_rss_added_mib": round(plain["rss_added_kib"] / 1024, 1),
        "archive_rss_added_mib": round(archive["rss_added_kib"] / 1024, 1),
        "ledger_only_mib_s": round(ledger_mibs, 1),
        # CPU per MiB of the ledger (counting and sha256) as the archiver runs it, and the
        # stdlib way's (without msgspec).
        "ledger_ms_per_mib": round(1000 / ledger_mibs, 2),
        "ledger_stdlib_ms_per_mib": round(1000 / stdlib_mibs, 2),
        # The share of the archive's time the ledger alone would take (CPU, no I/O).
        "ledger_share_of_archive_time": round(archive_mibs / ledger_mibs, 3),
        "targets": {"rss_added_mib": RSS_TARGET_MIB, "ratio": RATIO_TARGET},
        "ok": archive["rss_added_kib"] / 1024 <= RSS_TARGET_MIB
        and archive_mibs / plain_mibs >= RATIO_TARGET,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--text", type=int, default=3000)
    parser.add_argument(
        "--dir", help="where both copies are written (default: the temp dir; /dev/shm: no disk)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.mib, args.rounds, args.text, args.dir)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key:32} {value}")


if __name__ == "__main__":
    main()
