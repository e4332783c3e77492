"""Section 4: cold start, measured in fresh interpreters (also runs on its own).

Each probe runs in a new ``python`` process and times, inside that process, from before its
first import to the end of its initialisation (interpreter start-up is the same for every probe
and is left out), as wall time and as CPU time (``time.process_time``: on a shared machine the
steadier of the two), and the time the cyclic garbage collector took meanwhile:

- ``webhook``: load ``functions/webhook/app.py`` and build the app the first request uses
  (``opstate.api.default_app()``: settings, a DynamoDB store with its boto3 client, the verifier);
- ``reconciler``: load ``functions/reconcile/app.py``, then build its google-genai client and its
  store (what ``run_from_settings`` does before the first request);
- ``baseline``: ``import boto3; boto3.client("dynamodb")``, the reference;
- extra probes (``--all``, not in ``run.py``): ``webhook_entry`` (the entry alone: what the Lambda
  init phase runs) and ``webhook_tracing`` (``webhook`` with Lambda-style tracing on, so
  Powertools builds its ``Tracer`` and loads the X-Ray SDK, as a deployed function does).

The probes alternate (webhook, reconciler, baseline, webhook, ...) so that machine noise hits
all of them alike; one unmeasured warm-up round first fills the bytecode caches; each figure is
the median of ``rounds``. No probe touches the network: the endpoints point at 127.0.0.1 and
nothing is called. Each webhook probe also records whether ``google.genai`` got loaded (it must
not).

``--importtime`` adds where the webhook's init goes beyond the baseline: every module the webhook
probe imports and the baseline does not, with its own import time (``python -X importtime``,
the minimum over ``rounds`` runs), summed by package.

    .venv/bin/python benchmarks/bench_cold.py [--rounds 7] [--all] [--importtime] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAYER = ROOT / "layers" / "opstate"

_LOAD = """
import importlib.util
def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
"""
_WEBHOOK_ENTRY = _LOAD + '_load(ROOT + "/functions/webhook/app.py", "webhook_app")\n'
_WEBHOOK = _WEBHOOK_ENTRY + "from opstate.api import default_app\ndefault_app()\n"

# name -> (code, environment changes: None removes a variable)
PROBES: dict[str, tuple[str, dict[str, str | None]]] = {
    "webhook": (_WEBHOOK, {}),
    "reconciler": (
        _LOAD
        + """
_load(ROOT + "/functions/reconcile/app.py", "reconcile_app")
from opstate.config import settings
from opstate.reconcile import make_client
from opstate.store import store_from_url
make_client(settings())
store_from_url(settings().store_url, settings())
""",
        {},
    ),
    "baseline": ('import boto3\nboto3.client("dynamodb")\n', {}),
    "webhook_entry": (_WEBHOOK_ENTRY, {}),
    # LAMBDA_TASK_ROOT makes Powertools treat the process as a Lambda: tracing on.
    "webhook_tracing": (
        _WEBHOOK,
        {"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": None},
    ),
}
SECTION_PROBES = ("webhook", "reconciler", "baseline")
ALL_PROBES = tuple(PROBES)

_WRAPPER = """
import gc, sys, time
_gc = [0.0, 0.0]
def _gc_timer(phase, info):
    if phase == "start":
        _gc[1] = time.process_time()
    else:
        _gc[0] += time.process_time() - _gc[1]
gc.callbacks.append(_gc_timer)
_wall0, _cpu0 = time.perf_counter(), time.process_time()
ROOT = {root!r}
sys.path.insert(0, {layer!r})
{body}
_wall, _cpu = time.perf_counter() - _wall0, time.process_time() - _cpu0
_genai = any(m == "google.genai" or m.startswith("google.genai.") for m in sys.modules)
print("COLD", _wall * 1000.0, _cpu * 1000.0, _gc[0] * 1000.0, int(_genai))
"""


def _env(changes: dict[str, str | None] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:9",
            "OPSTATE_STORE": "dynamodb://bench-cold-start",
            "OPSTATE_WEBHOOK_SECRETS": "whsec_YmVuY2gtY29sZC1zdGFydC1zZWNyZXQtMzItYnl0ZXM=",
            "GEMINI_API_KEY": "bench-not-a-key",
            "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_NAMESPACE": "GeminiOpstateBench",
        }
    )
    for key in (
        "AWS_PROFILE",
        "OPSTATE_WEBHOOK_SECRET_ARN",
        "OPSTATE_TABLE_NAME",
        "OPSTATE_PUBLIC_URL",
        "LAMBDA_TASK_ROOT",
        "AWS_LAMBDA_FUNCTION_NAME",
        "PYTHONPROFILEIMPORTTIME",
    ):
        env.pop(key, None)
    for key, value in (changes or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _run(kind: str, extra_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    body, changes = PROBES[kind]
    code = _WRAPPER.format(root=str(ROOT), layer=str(LAYER), body=body)
    return subprocess.run(
        [sys.executable, *extra_args, "-c", code],
        capture_output=True,
        text=True,
        env=_env(changes),
        cwd=str(ROOT),
        timeout=120,
        check=False,
    )


def probe_once(kind: str) -> tuple[float, float, float, bool]:
    """One fresh-interpreter init of ``kind``: (wall ms, CPU ms, GC ms, google.genai loaded)."""
    proc = _run(kind)
    for line in proc.stdout.splitlines():
        if line.startswith("COLD "):
            _, wall, cpu, gc_ms, genai = line.split()
            return float(wall), float(cpu), float(gc_ms), genai == "1"
    raise RuntimeError(f"cold-start probe {kind!r} failed:\n{proc.stderr[-2000:]}")


Sample = tuple[float, float, float, bool]  # wall ms, CPU ms, GC ms, google.genai loaded


def _sample(rounds: int, probes: tuple[str, ...]) -> tuple[dict[str, list[Sample]], dict[str, str]]:
    """One warm-up round (bytecode caches, page cache), then ``rounds`` interleaved rounds."""
    samples: dict[str, list[Sample]] = {kind: [] for kind in probes}
    errors: dict[str, str] = {}
    for kind in probes:
        try:
            probe_once(kind)
        except RuntimeError as exc:
            errors[kind] = str(exc).splitlines()[-1] if str(exc) else "failed"
    for _ in range(rounds):
        for kind in (k for k in probes if k not in errors):
            samples[kind].append(probe_once(kind))
    return samples, errors


def measure(rounds: int, probes: tuple[str, ...] = SECTION_PROBES) -> dict[str, Any]:
    """Medians of ``rounds`` interleaved rounds of ``probes`` (the ``cold_start`` section)."""
    samples, errors = _sample(rounds, probes)

    def median(kind: str, column: int) -> float:
        values = [sample[column] for sample in samples[kind]]
        return statistics.median(values) if values else float("nan")

    result: dict[str, Any] = {}
    for kind in probes:
        result[f"{kind}_ms"] = round(median(kind, 0), 1)
        result[f"{kind}_cpu_ms"] = round(median(kind, 1), 1)
        result[f"{kind}_gc_ms"] = round(median(kind, 2), 1)
    for kind in (k for k in probes if k != "baseline" and "baseline" in probes):
        result[f"{kind}_ratio"] = round(median(kind, 0) / median("baseline", 0), 2)
        result[f"{kind}_cpu_ratio"] = round(median(kind, 1) / median("baseline", 1), 2)
    result["webhook_loads_google_genai"] = any(
        sample[3] for kind in probes if kind.startswith("webhook") for sample in samples[kind]
    )
    result["rounds"] = rounds
    result.update({f"{kind}_error": message for kind, message in errors.items()})
    return result


def _import_times(kind: str) -> dict[str, int]:
    """Module -> its own import time in microseconds (``-X importtime``) in one run of ``kind``."""
    proc = _run(kind, ("-X", "importtime"))
    if proc.returncode != 0:
        raise RuntimeError(f"cold-start probe {kind!r} failed:\n{proc.stderr[-2000:]}")
    own: dict[str, int] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, _cumulative_us, name = line.removeprefix("import time:").split("|", 2)
        own[name.strip()] = int(self_us)
    return own


def imports_beyond_baseline(kind: str, rounds: int) -> tuple[float, list[tuple[str, float, int]]]:
    """What ``kind`` imports that the baseline does not: (total ms, [(package, ms, modules)]),
    each module's own import time taken as its minimum over ``rounds`` runs."""
    best: dict[str, dict[str, int]] = {"baseline": {}, kind: {}}
    for _ in range(rounds):
        for probe, mins in best.items():
            for module, us in _import_times(probe).items():
                mins[module] = min(us, mins.get(module, us))
    extra = {m: us for m, us in best[kind].items() if m not in best["baseline"]}
    by_package: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    for module, us in extra.items():
        parts = module.split(".")
        package = ".".join(parts[:3] if parts[0] == "aws_lambda_powertools" else parts[:1])
        by_package[package] += us
        modules[package] += 1
    rows = [(package, us / 1000, modules[package]) for package, us in by_package.most_common()]
    return sum(extra.values()) / 1000, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--all", action="store_true", help="also the entry-only and tracing probes")
    parser.add_argument("--importtime", action="store_true", help="imports beyond the baseline")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)

    result = measure(args.rounds, ALL_PROBES if args.all else SECTION_PROBES)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"python {sys.version.split()[0]}, median of {args.rounds} fresh interpreters")
        print(f"{'probe':<16} {'wall ms':>8} {'ratio':>6} {'cpu ms':>8} {'ratio':>6} {'gc ms':>6}")
        for kind in ALL_PROBES if args.all else SECTION_PROBES:
            wall, cpu, gc_ms = (result[f"{kind}{s}"] for s in ("_ms", "_cpu_ms", "_gc_ms"))
            ratio = result.get(f"{kind}_ratio", 1.0)
            cpu_ratio = result.get(f"{kind}_cpu_ratio", 1.0)
            figures = f"{wall:>8.1f} {ratio:>6.2f} {cpu:>8.1f} {cpu_ratio:>6.2f} {gc_ms:>6.1f}"
            print(f"{kind:<16} {figures}")
        loaded = result["webhook_loads_google_genai"]
        print(f"google.genai loaded by the webhook: {'YES' if loaded else 'no'}")
        for key in sorted(k for k in result if k.endswith("_error")):
            print(f"{key}: {result[key]}")
    if args.importtime:
        total_ms, rows = imports_beyond_baseline("webhook", args.rounds)
        print(f"\nwebhook imports beyond the baseline: {total_ms:.1f} ms of own import time")
        for package, ms, count in rows[:20]:
            print(f"{ms:>8.1f}  {package} ({count} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
