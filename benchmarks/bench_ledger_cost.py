"""The ledger's cost per row before and after it keeps its token sums per price band (issue 41),
and what pricing a batch takes.

Each measurement runs in a fresh interpreter with ``opstate`` imported from a given tree: this
worktree (after) or ``git archive --before REV`` of the layer (before; default ``main``). The
rows are built in memory (``--rows`` lines of ``--text`` characters of answer, each with a
``modelVersion`` and a ``usageMetadata`` of all six counts, as Gemini writes them), cut into
1 MiB chunks and fed to ``BatchLedger`` the way the archiver does (msgspec; ``--stdlib`` also
measures the stdlib way). The CPU time of the feed (``time.process_time``) per row and per MiB;
rounds alternate before and after and keep each one's fastest (a shared machine slows a round).
``--mixed``: every other row's prompt is over 200k tokens (two bands in every block: the
per-row path), the worst case; the default is one band (every prompt under 100k: one model,
the usual batch). ``--details``: every row also carries ``promptTokensDetails`` and
``candidatesTokensDetails`` (one TEXT item each, as Gemini 2.5 writes them; issue 47 sums them
per modality).

Pricing (after only): ``import genai_prices`` in a fresh interpreter and one ``cost_of`` of the
summary (one ``calc_price`` per band).

The archive's throughput target (docs/bench.md, section 7: archive >= 0.8x a plain copy) is
met when the ledger costs little next to the copy: bench_archive.py measures that ratio.

Run: ``.venv/bin/python benchmarks/bench_ledger_cost.py [--rows 100000] [--text 900]
[--rounds 5] [--before main] [--mixed] [--details] [--stdlib] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LAYER = ROOT / "layers" / "opstate"
CHUNK = 1024 * 1024
MODEL = "gemini-2.5-flash"


DETAILS = os.environ.get("BENCH_LEDGER_DETAILS") == "1"  # set by --details for every child


def make_rows(rows: int, text: int, mixed: bool) -> bytes:
    lines = []
    for i in range(rows):
        prompt = 250_000 + i if mixed and i % 2 else 1_000 + i % 500
        row = {
            "key": f"request-{i:08d}",
            "response": {
                "candidates": [
                    {
                        "content": {"parts": [{"text": "x" * text}], "role": "model"},
                        "finishReason": "STOP",
                    }
                ],
                "modelVersion": MODEL,
                "usageMetadata": {
                    "promptTokenCount": prompt,
                    "candidatesTokenCount": 200,
                    "thoughtsTokenCount": 50,
                    "cachedContentTokenCount": 0,
                    "toolUsePromptTokenCount": 0,
                    "totalTokenCount": prompt + 250,
                },
            },
        }
        if DETAILS:
            usage = row["response"]["usageMetadata"]  # type: ignore[index]
            usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
            usage["candidatesTokensDetails"] = [{"modality": "TEXT", "tokenCount": 200}]
        lines.append(json.dumps(row, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


def child(rows: int, text: int, mixed: bool, use_msgspec: bool, price: bool) -> dict[str, Any]:
    from opstate.outcomes.ledger import BatchLedger

    data = make_rows(rows, text, mixed)
    chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    ledger = BatchLedger(use_msgspec=use_msgspec)
    start = time.process_time()
    for chunk in chunks:
        ledger.count(chunk)  # the counting only (the sha256 is the same before and after)
    ledger.finish()
    cpu = time.process_time() - start
    assert ledger.rows.succeeded == rows, ledger.rows
    out: dict[str, Any] = {"cpu_s": cpu, "bytes": len(data), "rows": rows}
    if price:
        from opstate.outcomes.price import bands_of, cost_of

        summary = {"rows": ledger.rows.as_dict(), "usageBands": bands_of(ledger.bands)}
        begin = time.perf_counter()
        cost = cost_of(summary, None, time.time_ns(), time.time_ns())  # imports genai-prices
        first = time.perf_counter() - begin
        begin = time.perf_counter()
        cost_of(summary, None, time.time_ns(), time.time_ns())
        again = time.perf_counter() - begin
        out.update(
            bands=len(summary["usageBands"]),
            usd=cost["usd"],
            first_price_s=first,
            price_s=again,
        )
    return out


def run_child(layer: Path, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{layer}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=1800,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def before_tree(rev: str, into: Path) -> Path:
    """The layer of ``rev`` extracted under ``into`` (``git archive``)."""
    archive = into / "before.tar"
    with archive.open("wb") as out:
        subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "layers/opstate/opstate"],
            stdout=out,
            check=True,
        )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "layers" / "opstate"


def import_seconds() -> float:
    """``import genai_prices`` in a fresh interpreter (wall seconds)."""
    code = (
        "import time; t = time.perf_counter(); import genai_prices; print(time.perf_counter() - t)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


def measure(
    rows: int, text: int, rounds: int, before: str, mixed: bool, ways: list[str]
) -> dict[str, Any]:
    result: dict[str, Any] = {"rows": rows, "text": text, "mixed": mixed, "before": before}
    with tempfile.TemporaryDirectory() as tmp:
        old = before_tree(before, Path(tmp))
        for way in ways:
            best: dict[str, float] = {}
            for _ in range(rounds):
                for label, layer in (("before", old), ("after", LAYER)):
                    args = [str(rows), str(text), str(int(mixed)), way, "0"]
                    cpu = run_child(layer, *args)["cpu_s"]
                    best[label] = min(best.get(label, cpu), cpu)
            size = len(make_rows(rows, text, mixed))
            result[way] = {
                label: {
                    "cpu_s": seconds,
                    "ns_per_row": seconds / rows * 1e9,
                    "mib_per_s": size / (1024 * 1024) / seconds,
                }
                for label, seconds in best.items()
            } | {"after_over_before": best["after"] / best["before"]}
    priced = run_child(LAYER, str(rows), str(text), str(int(mixed)), "msgspec", "1")
    result["pricing"] = {
        "import_genai_prices_s": min(import_seconds() for _ in range(3)),
        "bands": priced["bands"],
        "first_cost_of_s": priced["first_price_s"],
        "cost_of_s": priced["price_s"],
        "usd": priced["usd"],
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=5)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--text", type=int, default=900)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", default="main")
    parser.add_argument("--mixed", action="store_true")
    parser.add_argument("--stdlib", action="store_true", help="measure the stdlib way too")
    parser.add_argument("--details", action="store_true", help="per-modality lists in rows")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.child:
        rows, text, mixed, way, price = args.child
        out = child(int(rows), int(text), mixed == "1", way == "msgspec", price == "1")
        print(json.dumps(out))
        return
    if args.details:
        os.environ["BENCH_LEDGER_DETAILS"] = "1"
        global DETAILS
        DETAILS = True
    ways = ["msgspec", "stdlib"] if args.stdlib else ["msgspec"]
    result = measure(args.rows, args.text, args.rounds, args.before, args.mixed, ways)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    bands = "two bands" if args.mixed else "one band"
    print(f"ledger over {args.rows} rows of ~{args.text} chars ({bands})")
    for way in ways:
        r = result[way]
        for label in ("before", "after"):
            m = r[label]
            print(
                f"  {way:8} {label:6} {m['ns_per_row']:8.0f} ns/row  "
                f"{m['mib_per_s']:7.1f} MiB/s CPU"
            )
        print(f"  {way:8} after/before CPU: {r['after_over_before']:.3f}")
    p = result["pricing"]
    print(
        f"pricing: import genai_prices {p['import_genai_prices_s']:.3f} s; {p['bands']} band(s): "
        f"first cost_of {p['first_cost_of_s']:.3f} s (with the import), "
        f"then {p['cost_of_s'] * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
