"""How fast ``opstate`` says no, and says "nothing to do" (issue 40: refusing a bad 10-line file
took 1.1-2.1 s, google-genai imported before anything was checked; ``submit``, ``archive --once``
and ``retry --once`` took 1.1-3.9 s with nothing to do).

Each command runs as its own process (``python -m opstate.cli``, a fresh interpreter: what a
person waits for), ``--runs`` times; the median wall time is printed beside ``opstate --help``'s
and their ratio (the issue's bar: a bad file refused within 2x of ``--help``). No Gemini key
is set (``--key``: one that is never used, as a person's shell would have it) and nothing
reaches Gemini; the store is a SQLite file in a temporary folder.

Usage: ``python benchmarks/bench_cli_refusal.py [--runs N]``. Never part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS: dict[str, list[str]] = {
    "help": ["--help"],
    "submit_bad_file": ["submit", "bad.jsonl", "--model", "gemini-2.5-flash"],
    "archive_nothing": ["archive", "--once"],
    "retry_nothing": ["retry", "--once"],
}


def bad_file(folder: Path) -> None:
    """Ten lines, the tenth without a request."""
    lines = [json.dumps({"key": f"k{i}", "request": {"contents": []}}) for i in range(9)]
    lines.append(json.dumps({"key": "k9"}))
    (folder / "bad.jsonl").write_text("\n".join(lines) + "\n")


def timed(argv: list[str], folder: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "opstate.cli", *argv],
        cwd=folder,
        env=env,
        capture_output=True,
        check=False,
    )
    return time.perf_counter() - start


def measure(runs: int, key: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPSTATE_", "GEMINI_"))}
    env["OPSTATE_STORE"] = "sqlite:///ops.db"
    if key:  # a key that is never used: every command here is refused or has nothing to do
        env["GEMINI_API_KEY"] = "bench-unused-key"
    medians: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as raw:
        folder = Path(raw)
        bad_file(folder)
        timed(["--help"], folder, env)  # warm the file cache once
        for label, argv in COMMANDS.items():
            medians[label] = statistics.median(timed(argv, folder, env) for _ in range(runs))
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--key", action="store_true", help="set GEMINI_API_KEY (never used) as a person would"
    )
    args = parser.parse_args()
    medians = measure(args.runs, args.key)
    base = medians["help"]
    for label, seconds in medians.items():
        print(f"{label:<16} {seconds * 1000:7.0f} ms  {seconds / base:4.2f}x help")


if __name__ == "__main__":
    main()
