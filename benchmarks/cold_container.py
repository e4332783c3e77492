"""Cold init as Lambda sees it: the built functions in a Lambda-like container, under the CPU
share of a memory size, code read-only.

Lambda gives a function CPU in proportion to its memory (1,769 MB = one vCPU), and its code in
``/var/task`` and ``/opt`` is read-only, so Python can only use the bytecode the package ships.
Each sample is one fresh container of the Lambda base image (``make lambda-base-image``) with

- ``.aws-sam/build/<Function>`` mounted read-only at ``/var/task`` and the built layer at
  ``/opt`` (read-only), ``--network none``, ``--cpus = memory / 1769``;
- a probe that times, inside the container, from before the first import to the end of init:
  ``import app`` (the handler module) then building what the first request needs (webhook: the
  API app with its store, boto3 client and verifier; reconciler: its google-genai client and
  its store) - interpreter start-up is left out, as in the host benchmark (bench_cold.py);
- two modes, side by side in one run: ``bytecode`` (the build as shipped, with its ``.pyc``) and
  ``source`` (a copy of the same build without any ``.pyc``, also mounted read-only: every
  module of the function and the layer compiled from source at each start, as with the build
  before it compiled; the interpreter's own standard library keeps its bytecode, as in Lambda);
- besides the wall time, the CPU time of the same span (``time.process_time``): on a shared
  host the wall time under a CPU quota also counts waiting for the host's CPUs, the CPU time
  does not, so ``cpu_ms / cpus`` is what the quota alone would give.

The figure is the median of ``rounds`` fresh containers per (function, memory, mode). Where no
Docker engine answers, or the image or the build is missing, the section says so and nothing is
measured (the host figures of bench_cold.py remain).

``python benchmarks/cold_container.py [--rounds N] [--quick]`` prints the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / ".aws-sam" / "build"
# The functions' runtime (template.yaml) and the base image SAM runs it on.
RUNTIME = "python3.13"
IMAGE = f"public.ecr.aws/lambda/python:{RUNTIME.removeprefix('python')}-x86_64"
FULL_VCPU_MB = 1769
MEMORY_SIZES = (256, 512, 1024, 1769)
# Lambda x86_64 price per GB-second (us-east-1); the init phase is billed like the handler.
PRICE_PER_GB_S = 0.0000166667
TARGET_MS = {"webhook": 1000.0, "reconciler": 1000.0}

FUNCTIONS: dict[str, dict[str, Any]] = {
    "webhook": {
        "logical_id": "WebhookFunction",
        "init": "from opstate.api import default_app\ndefault_app()\n",
    },
    "reconciler": {
        "logical_id": "ReconcileFunction",
        "init": (
            "from opstate.config import settings\n"
            "from opstate.reconcile import make_client\n"
            "from opstate.store import store_from_url\n"
            "make_client(settings())\n"
            "store_from_url(settings().store_url, settings())\n"
        ),
    },
}

# The import path Lambda's bootstrap builds (the function, then the layer's two directories). Set
# by the probe itself: AWS's base image sets no PYTHONPATH (its bootstrap builds sys.path), so a
# probe that relied on the image's environment found app.py (the working directory) but not
# the layer: ``ModuleNotFoundError: aws_lambda_powertools``.
LAMBDA_PATH = ("/var/task", f"/opt/python/lib/{RUNTIME}/site-packages", "/opt/python")

PROBE = """
import sys
sys.path[:0] = {path!r}
import time
_t0 = time.perf_counter()
_c0 = time.process_time()
import app
{init}
print("INIT_MS", (time.perf_counter() - _t0) * 1000.0, (time.process_time() - _c0) * 1000.0)
"""

ENV = {
    # What Lambda sets (Tracing: Active makes Powertools import the X-Ray SDK), fake AWS.
    "AWS_EXECUTION_ENV": f"AWS_Lambda_{RUNTIME}",
    "AWS_LAMBDA_FUNCTION_NAME": "bench",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_XRAY_CONTEXT_MISSING": "LOG_ERROR",
    "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000",
    "POWERTOOLS_SERVICE_NAME": "bench",
    "POWERTOOLS_METRICS_NAMESPACE": "GeminiOpstateBench",
    "OPSTATE_STORE": "dynamodb://bench-cold-start",
    "OPSTATE_WEBHOOK_SECRETS": "whsec_YmVuY2gtY29sZC1zdGFydC1zZWNyZXQtMzItYnl0ZXM=",
    # As deployed: the webhook's quarantine is an SQS queue (its client is built on first use).
    "OPSTATE_QUARANTINE_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/bench-q",
    "GEMINI_API_KEY": "bench-not-a-key",
}


def unavailable() -> str | None:
    """Why the container benchmark cannot run here (None: it can)."""
    if shutil.which("docker") is None:
        return "no docker CLI"
    info = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if info.returncode != 0:
        return "no Docker engine answers `docker info`"
    image = subprocess.run(
        ["docker", "image", "inspect", IMAGE], capture_output=True, timeout=30, check=False
    )
    if image.returncode != 0:
        return f"{IMAGE} is missing (make lambda-base-image)"
    for spec in FUNCTIONS.values():
        if not (BUILD / spec["logical_id"] / "app.py").is_file():
            return ".aws-sam/build is missing (make build)"
    return None


def configured_memory() -> dict[str, int]:
    """Each function's MemorySize in template.yaml (its own, else Globals)."""
    from tests.support.template import load_template

    template = load_template()

    def value(setting: Any) -> int:  # a number, or a Ref to a parameter (its default)
        if isinstance(setting, dict):
            return int(template["Parameters"][setting["Ref"]]["Default"])
        return int(setting)

    default = template["Globals"]["Function"].get("MemorySize", 128)
    out = {}
    for name, spec in FUNCTIONS.items():
        props = template["Resources"][spec["logical_id"]]["Properties"]
        out[name] = value(props.get("MemorySize", default))
    return out


@contextlib.contextmanager
def builds_without_bytecode() -> Iterator[Path]:
    """A temporary copy of .aws-sam/build (the layer and the measured functions) without any
    ``.pyc``: the build as it was before it compiled.

    Made beside the build (in ``.aws-sam``), not in the system's temporary folder: an engine
    that can mount the build can mount it (a daemon with its own /tmp, or one running as
    another user, cannot read a private 0700 temporary folder), and opened to 0755 like the
    build. Symlinks are followed, so nothing in it points outside the mount."""
    with tempfile.TemporaryDirectory(prefix="bench-no-pyc-", dir=BUILD.parent) as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        skip = shutil.ignore_patterns("__pycache__", "*.pyc")
        for logical_id in ["OpstateLayer", *(spec["logical_id"] for spec in FUNCTIONS.values())]:
            shutil.copytree(BUILD / logical_id, root / logical_id, ignore=skip)
        yield root


def probe_once(
    function: str, memory_mb: int, mode: str, source_build: Path | None = None
) -> tuple[float, float]:
    """One fresh container: (wall ms, CPU ms) of the init. ``source`` mode mounts
    ``source_build`` (see ``builds_without_bytecode``)."""
    spec = FUNCTIONS[function]
    cpus = memory_mb / FULL_VCPU_MB
    env = {**ENV, "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory_mb)}
    build = BUILD
    if mode == "source":
        if source_build is None:
            raise ValueError("source mode needs the build without bytecode")
        build = source_build
    command = [
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        f"--cpus={cpus:.3f}",
        f"--memory={memory_mb}m",
        "-v",
        f"{build / spec['logical_id']}:/var/task:ro",
        "-v",
        f"{build / 'OpstateLayer'}:/opt:ro",
        "-w",
        "/var/task",
    ]
    for key, value in env.items():
        command += ["-e", f"{key}={value}"]
    probe = PROBE.format(path=list(LAMBDA_PATH), init=spec["init"])
    command += ["--entrypoint", RUNTIME, IMAGE, "-c", probe]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("INIT_MS "):
            _, wall, cpu = line.split()
            return float(wall), float(cpu)
    raise RuntimeError(f"{function} @ {memory_mb} MB ({mode}) failed:\n{proc.stderr[-2000:]}")


def measure(rounds: int = 5, sizes: tuple[int, ...] = MEMORY_SIZES) -> dict[str, Any]:
    reason = unavailable()
    if reason is not None:
        print(f"[bench] cold start in a container: NOT MEASURED ({reason})", file=sys.stderr)
        return {"skipped": reason}
    memory = configured_memory()
    result: dict[str, Any] = {
        "image": IMAGE,
        "rounds": rounds,
        "cpus_per_mb": f"memory / {FULL_VCPU_MB}",
        "price_per_gb_s": PRICE_PER_GB_S,
        "functions": {},
    }
    with builds_without_bytecode() as source_build:
        for function in FUNCTIONS:
            result["functions"][function] = _measure_function(
                function, sorted({*sizes, memory[function]}), memory[function], rounds, source_build
            )
    return result


def _measure_function(
    function: str, all_sizes: list[int], configured_mb: int, rounds: int, source_build: Path
) -> dict[str, Any]:
    samples: dict[tuple[int, str], list[tuple[float, float]]] = {
        (m, mode): [] for m in all_sizes for mode in ("source", "bytecode")
    }
    for _ in range(rounds):  # interleaved, so machine noise hits every cell alike
        for key in samples:
            samples[key].append(probe_once(function, *key, source_build=source_build))
    by_memory: dict[str, Any] = {}
    for m in all_sizes:
        source = statistics.median(wall for wall, _ in samples[(m, "source")])
        bytecode = statistics.median(wall for wall, _ in samples[(m, "bytecode")])
        source_cpu = statistics.median(cpu for _, cpu in samples[(m, "source")])
        bytecode_cpu = statistics.median(cpu for _, cpu in samples[(m, "bytecode")])
        by_memory[str(m)] = {
            "cpus": round(m / FULL_VCPU_MB, 3),
            "source_ms": round(source, 1),
            "bytecode_ms": round(bytecode, 1),
            "speedup": round(source / bytecode, 2),
            "source_cpu_ms": round(source_cpu, 1),
            "bytecode_cpu_ms": round(bytecode_cpu, 1),
            "init_cost_usd_per_million": round(
                bytecode / 1000 * m / 1024 * PRICE_PER_GB_S * 1e6, 2
            ),
        }
    meeting = [m for m in all_sizes if by_memory[str(m)]["bytecode_ms"] <= TARGET_MS[function]]
    return {
        "configured_mb": configured_mb,
        "target_ms": TARGET_MS[function],
        "cheapest_meeting_target_mb": min(meeting) if meeting else None,
        "by_memory": by_memory,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(MEMORY_SIZES))
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    print(json.dumps(measure(args.rounds, tuple(args.sizes)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
