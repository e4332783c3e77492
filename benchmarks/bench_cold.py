"""Section 4: cold start, measured in fresh interpreters.

Each probe runs in a new ``python`` process and times, inside that process, from before the first
import to the end of initialisation (interpreter start-up itself is the same for every probe and
is left out):

- ``webhook``: load ``functions/webhook/app.py`` and build the app the Lambda serves
  (``opstate.api.default_app()``: settings, a DynamoDB store with its boto3 client, the verifier);
- ``reconciler``: load ``functions/reconcile/app.py``, then build its google-genai client and its
  store (what ``run_from_settings`` does before the first request);
- ``baseline``: ``import boto3; boto3.client("dynamodb")``.

The probes alternate (webhook, reconciler, baseline, webhook, ...) so that machine noise hits
all three alike; one unmeasured warm-up round first fills the bytecode caches. No probe touches
the network: the endpoints point at 127.0.0.1 and nothing is called.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_LOAD = """
import importlib.util, sys
def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
"""

PROBES: dict[str, str] = {
    "webhook": _LOAD
    + """
_load(ROOT + "/functions/webhook/app.py", "webhook_app")
from opstate.api import default_app
default_app()
""",
    "reconciler": _LOAD
    + """
_load(ROOT + "/functions/reconcile/app.py", "reconcile_app")
from opstate.config import settings
from opstate.reconcile import make_client
from opstate.store import store_from_url
make_client(settings())
store_from_url(settings().store_url, settings())
""",
    "baseline": """
import boto3
boto3.client("dynamodb")
""",
}

_WRAPPER = """
import time
_t0 = time.perf_counter()
ROOT = {root!r}
{body}
print("ELAPSED_MS", (time.perf_counter() - _t0) * 1000.0)
"""


def _env() -> dict[str, str]:
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
    env.pop("AWS_PROFILE", None)
    env.pop("OPSTATE_WEBHOOK_SECRET_ARN", None)
    env.pop("OPSTATE_TABLE_NAME", None)
    return env


def probe_once(kind: str, env: dict[str, str] | None = None) -> float:
    """Milliseconds of one fresh-interpreter import-and-init of ``kind``."""
    code = _WRAPPER.format(root=str(ROOT), body=PROBES[kind])
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env or _env(),
        cwd=str(ROOT),
        timeout=120,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("ELAPSED_MS "):
            return float(line.split()[1])
    raise RuntimeError(f"cold-start probe {kind!r} failed:\n{proc.stderr[-2000:]}")


def measure(rounds: int) -> dict[str, float | int | str]:
    env = _env()
    samples: dict[str, list[float]] = {kind: [] for kind in PROBES}
    errors: dict[str, str] = {}
    for kind in PROBES:  # warm-up: bytecode caches, page cache
        try:
            probe_once(kind, env)
        except RuntimeError as exc:
            errors[kind] = str(exc).splitlines()[-1] if str(exc) else "failed"
    for _ in range(rounds):
        for kind in PROBES:
            if kind in errors:
                continue
            samples[kind].append(probe_once(kind, env))
    median = {k: statistics.median(v) if v else float("nan") for k, v in samples.items()}
    result: dict[str, float | int | str] = {
        "webhook_ms": round(median["webhook"], 1),
        "reconciler_ms": round(median["reconciler"], 1),
        "baseline_ms": round(median["baseline"], 1),
        "webhook_ratio": round(median["webhook"] / median["baseline"], 2),
        "reconciler_ratio": round(median["reconciler"] / median["baseline"], 2),
        "rounds": rounds,
    }
    for kind, message in errors.items():
        result[f"{kind}_error"] = message
    return result


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 5), indent=2))
