"""The submit function's own work on a job's input, measured (issue 46; docs/jobs.md "On AWS"):
the CPU seconds per GiB its code spends reading an ``s3://`` input through the check, the
copy's multipart write into the results bucket, and the split (``retry.job_submit.submit_job``'s
three passes, as the function runs them: ``retry.inputs.keep_input`` with ``reuse=False``, then
``domain.parts.split_hashed`` over the input read again through the checked sha256, then the
plan), and its peak memory.

S3 is a moto server in its own process on 127.0.0.1: the function's real boto3 clients (the
S3 sink's and the input's, retries and all) talk HTTP to it, so boto3's own work (signing,
parsing, the managed copy's threads) is counted, and the server's is not: CPU is this
process's user + system time (``getrusage``), never the wall clock. The loopback stands in for
the network, whose time on AWS docs/jobs.md adds from S3's published throughput.

Memory: the process's high-water mark (``VmHWM``) after the three passes, absolute (what
Lambda's "Max Memory Used" counts, the imports of the function included: boto3, Powertools,
google-genai) and added over the RSS just before them (the mark reset through
``/proc/self/clear_refs``), in a fresh interpreter.

The input is generated (``--mib`` MiB of ``--bytes``-byte JSONL request lines, default 256 MiB
of 1,074-byte lines), written to a temporary file and uploaded to the server first (not
measured).

Run: ``.venv/bin/python benchmarks/bench_submit_s3.py [--mib N] [--bytes B] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from bench_archive import run_child, status_kib  # noqa: E402
from bench_job_split import generated  # noqa: E402

BUCKET = "bench-results"
INPUT_KEY = "incoming/big.jsonl"
GiB = 1024**3
MiB = 1024**2
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def child(endpoint: str) -> dict[str, Any]:
    os.environ.update(AWS_ENV | {"AWS_ENDPOINT_URL": endpoint})
    # What the submit function has imported by the time it reads the input.
    import aws_lambda_powertools  # noqa: F401
    import boto3  # noqa: F401
    import google.genai  # noqa: F401

    from opstate.config import DEFAULT_SUBMIT_MAX_FILE_BYTES, DEFAULT_SUBMIT_MAX_ROWS
    from opstate.domain.parts import Bounds, split_hashed
    from opstate.outcomes.s3_sink import S3Sink
    from opstate.retry import jobs
    from opstate.retry.feeding import lines_of
    from opstate.retry.inputs import keep_input, source_chunks, verified

    sink = S3Sink(BUCKET, "results")
    source = source_chunks(f"s3://{BUCKET}/{INPUT_KEY}")
    starts: list[tuple[float, float]] = []

    def read() -> Any:  # each pass's start: (cpu, wall)
        starts.append((cpu_s(), time.perf_counter()))
        return source()

    Path("/proc/self/clear_refs").write_text("5")
    before = status_kib("VmRSS")
    kept = keep_input(read, sink, 32 * MiB, reuse=False)
    copied = (cpu_s(), time.perf_counter())
    bounds = Bounds(3_000_000, DEFAULT_SUBMIT_MAX_FILE_BYTES, DEFAULT_SUBMIT_MAX_ROWS)
    parts = list(split_hashed(lines_of(verified(read(), kept.sha256, "the input")), bounds))
    plan = jobs.new_plan(jobs.new_job_id(), "gemini-2.5-flash", kept.as_dict(), parts)
    done = (cpu_s(), time.perf_counter())
    peak = status_kib("VmHWM")
    (check_cpu, check_wall), (copy_cpu, copy_wall), (split_cpu, split_wall) = starts
    size = kept.bytes
    phases = {
        "check": (copy_cpu - check_cpu, copy_wall - check_wall),
        "copy": (copied[0] - copy_cpu, copied[1] - copy_wall),
        "split": (done[0] - split_cpu, done[1] - split_wall),
    }
    out: dict[str, Any] = {
        "bytes": size,
        "rows": kept.rows,
        "parts": len(plan["parts"]),
    }
    for phase, (cpu, wall) in phases.items():
        out[f"{phase}_cpu_s"] = round(cpu, 2)
        out[f"{phase}_wall_s"] = round(wall, 2)
    total = sum(cpu for cpu, _ in phases.values())
    out["cpu_s"] = round(total, 2)
    out["cpu_s_per_gib"] = round(total * GiB / size, 1)
    out["peak_rss_mib"] = round(peak / 1024, 1)
    out["rss_before_mib"] = round(before / 1024, 1)
    out["peak_added_mib"] = round((peak - before) / 1024, 1)
    return out


def measure(mib: int, line_bytes: int) -> dict[str, Any]:
    import boto3

    from tests.support.motoserver import start_moto_server

    server = start_moto_server(atomic_dynamodb=False)
    try:
        s3 = boto3.client(
            "s3",
            endpoint_url=server.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        s3.create_bucket(Bucket=BUCKET)
        lines = mib * MiB // line_bytes
        with tempfile.NamedTemporaryFile(suffix=".jsonl") as handle:
            for chunk in generated(lines, line_bytes):
                handle.write(chunk)
            handle.flush()
            s3.upload_file(handle.name, BUCKET, INPUT_KEY)
        return run_child(__file__, server.endpoint)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--bytes", type=int, default=1074)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=1, metavar="ENDPOINT")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0])))
        return
    result = measure(args.mib, args.bytes)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>16}: {value}")


if __name__ == "__main__":
    main()
