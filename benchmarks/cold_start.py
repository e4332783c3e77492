"""Cold start of the webhook Lambda entry, next to boto3's own, in fresh interpreters.

Each variant runs ``--runs`` times (default 7) in a new ``python`` process, interleaved, with
the layer directory on ``sys.path`` and a minimal environment; the child reports the time its
imports took (``perf_counter`` around them) and the parent the process's wall time. Medians:

- ``boto3-dynamodb``: ``import boto3; boto3.client("dynamodb")`` - the reference;
- ``webhook-entry``: importing ``functions/webhook/app.py`` (what the Lambda init phase does);
- ``webhook-entry+app``: that plus building the app the first request uses (settings, the
  DynamoDB store and its boto3 client, the verifier) - no network is touched;
- the same two with ``LAMBDA_TASK_ROOT`` set, so Powertools enables tracing and the X-Ray SDK
  is loaded (as in a deployed function with tracing on).

``--importtime`` also prints the heaviest imports of the entry (``python -X importtime``).

    .venv/bin/python benchmarks/cold_start.py [--runs 7] [--importtime]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYER = ROOT / "layers" / "opstate"
ENTRY = ROOT / "functions" / "webhook" / "app.py"

PRELUDE = f"""
import sys, time
sys.path.insert(0, {str(LAYER)!r})
t0 = time.perf_counter()
"""
LOAD_ENTRY = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("webhook_entry", {str(ENTRY)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
"""
BUILD_APP = "import opstate.api\nopstate.api.default_app()\n"
# LAMBDA_TASK_ROOT makes Powertools treat the process as a Lambda: tracing on, X-Ray SDK loaded.
TRACING_ON = {"LAMBDA_TASK_ROOT": "/var/task"}
CHILDREN: dict[str, tuple[str, dict[str, str]]] = {
    "boto3-dynamodb": ('import boto3\nboto3.client("dynamodb")\n', {}),
    "webhook-entry": (LOAD_ENTRY, {}),
    "webhook-entry+app": (LOAD_ENTRY + BUILD_APP, {}),
    "entry, tracing on": (LOAD_ENTRY, TRACING_ON),
    "entry+app, tracing on": (LOAD_ENTRY + BUILD_APP, TRACING_ON),
}
REPORT = """
elapsed = time.perf_counter() - t0
genai = any(m == "google.genai" or m.startswith("google.genai.") for m in sys.modules)
print(f"{elapsed * 1000:.3f} {int(genai)}")
"""

ENV = {
    "PATH": "/usr/bin:/bin",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "OPSTATE_TABLE_NAME": "opstate-cold-start",
    "OPSTATE_WEBHOOK_SECRETS": "whsec_Z2VtaW5pLW9wc3RhdGUtZml4ZWQtdGVzdC1zZWNyZXQ=",
}


def run_child(
    code: str, extra_env: dict[str, str] | None = None, extra_args: tuple[str, ...] = ()
) -> tuple[float, float, bool, str]:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, *extra_args, "-c", PRELUDE + code + REPORT],
        capture_output=True,
        text=True,
        env={**ENV, **(extra_env or {})},
        cwd="/",
        timeout=120,
        check=True,
    )
    wall = (time.perf_counter() - started) * 1000
    import_ms, genai = result.stdout.split()[-2:]
    return float(import_ms), wall, genai == "1", result.stderr


def heaviest_imports(top: int = 15) -> list[tuple[int, str]]:
    _, _, _, stderr = run_child(LOAD_ENTRY, TRACING_ON, ("-X", "importtime"))
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self_part, cumulative_us, name = line.removeprefix("import time:").split("|", 2)
        rows.append((int(cumulative_us), name.rstrip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the medians as JSON")
    args = parser.parse_args()

    for code, env in CHILDREN.values():  # warm the bytecode caches once
        run_child(code, env)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in CHILDREN}
    genai_loaded = False
    for _ in range(args.runs):
        for name, (code, env) in CHILDREN.items():
            import_ms, wall_ms, genai, _ = run_child(code, env)
            samples[name].append((import_ms, wall_ms))
            genai_loaded |= genai and name != "boto3-dynamodb"
    medians = {
        name: {
            "import_ms": round(statistics.median(s[0] for s in runs), 1),
            "process_ms": round(statistics.median(s[1] for s in runs), 1),
        }
        for name, runs in samples.items()
    }
    if args.json:
        print(json.dumps({"runs": args.runs, "medians": medians, "google_genai": genai_loaded}))
    else:
        print(f"python {sys.version.split()[0]}, {args.runs} fresh interpreters per variant")
        print(f"{'variant':<24} {'imports (ms)':>13} {'process (ms)':>13}")
        for name, m in medians.items():
            print(f"{name:<24} {m['import_ms']:>13.1f} {m['process_ms']:>13.1f}")
        print(f"google.genai loaded by the webhook entry: {'YES' if genai_loaded else 'no'}")
    if args.importtime:
        print("\nheaviest imports of the webhook entry, tracing on (cumulative ms):")
        for cumulative_us, name in heaviest_imports():
            print(f"{cumulative_us / 1000:>9.1f}  {name}")


if __name__ == "__main__":
    main()
