"""``make bench``: every figure measured in one run next to its reference; writes results.json.

Usage: ``python benchmarks/run.py [--quick] [--out PATH] [--skip SECTION ...]``.
Sections: ingest, hotpath, calls, contention, cold, cold-container, seed, reconcile, archive,
retry, aws-cost (see benchmarks/README.md for every key).
Never part of ``make test``: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for entry in (str(HERE), str(ROOT)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

# Fake AWS credentials before any boto3 client exists: nothing here reaches AWS.
for _key, _value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_NAMESPACE": "GeminiOpstateBench",
}.items():
    os.environ[_key] = _value
os.environ.pop("AWS_PROFILE", None)

import bench_archive  # noqa: E402
import bench_aws_cost  # noqa: E402
import bench_calls  # noqa: E402
import bench_cold  # noqa: E402
import bench_hotpath  # noqa: E402
import bench_ingest  # noqa: E402
import bench_retry_file  # noqa: E402
import cold_container  # noqa: E402
import reconcile_scale  # noqa: E402
import seed_compare  # noqa: E402

TARGETS = {
    "ingest_ratio": 0.67,
    "hotpath_ratio": bench_hotpath.TARGET_RATIO,
    "calls_new": 1,
    "calls_advancing": 1,
    "calls_duplicate": 1,
    "calls_contended": 3,
    "webhook_cold_ratio": 1.25,
    "reconcile_reduction": 5.0,
    "reconcile_over_schedule": 0,
    "reconcile_starved": 0,
    "reconcile_scans": 0,
}

SIZES = {
    # quick: the whole run in under a minute on 2 cores
    True: {
        "sqlite_n": 300,
        "moto_n": 60,
        "rounds": 3,
        "calls_n": 30,
        "contended": 200,
        "contention": 1000,
        "contention_moto": 300,
        "cold_rounds": 7,
        "hotpath_n": 500,
        "container_rounds": 3,
        "seed_ops": 120,
        "reconcile_ops": 1000,
    },
    False: {
        "sqlite_n": 2000,
        "moto_n": 300,
        "rounds": 5,
        "calls_n": 100,
        "contended": 400,
        "contention": 1000,
        "contention_moto": 1000,
        "cold_rounds": 11,
        "hotpath_n": 2000,
        "container_rounds": 5,
        "seed_ops": 600,
        "reconcile_ops": 10_000,
    },
}


@contextmanager
def moto_dynamodb() -> Iterator[tuple[Any, Callable[[], Any]]]:
    """A moto server on 127.0.0.1 and a factory of DynamoDB stores on fresh tables."""
    import boto3

    from opstate.store.dynamodb import DynamoDBStore
    from tests.support.motoserver import start_moto_server
    from tests.support.template import create_table_from_template

    server = start_moto_server()
    try:
        client = boto3.client("dynamodb", endpoint_url=server.endpoint, region_name="us-east-1")

        def new_store() -> Any:
            table = f"bench-{uuid.uuid4().hex[:10]}"
            create_table_from_template(client, table)
            return DynamoDBStore(table, client=client)

        yield client, new_store
    finally:
        server.stop()


def section_ingest(size: dict[str, int], tmp: Path, moto: Any) -> dict[str, Any]:
    from opstate.store.sqlite import SQLiteStore

    out: dict[str, dict[str, Any]] = {}
    store = SQLiteStore(tmp / "ingest.db")
    try:
        out["sqlite"] = bench_ingest.throughput(store, "sq", size["sqlite_n"], size["rounds"])
        out["sqlite"]["breakdown"] = bench_ingest.breakdown(store, "sq", size["sqlite_n"])
    finally:
        store.close()
    _, new_store = moto
    dstore = new_store()
    out["moto"] = bench_ingest.throughput(dstore, "mo", size["moto_n"], size["rounds"])
    return out


def section_calls(size: dict[str, int], moto: Any) -> dict[str, Any]:
    client, new_store = moto
    counter = bench_calls.ApiCallCounter(client)
    store = new_store()
    before = counter.total()
    result: dict[str, Any] = dict(
        bench_calls.calls_per_event(
            store, "calls", size["calls_n"], counter.total, size["contended"]
        )
    )
    result["store"] = "DynamoDBStore on moto server (DynamoDB API calls)"
    result["api_calls_total"] = counter.total() - before
    # GSI writes of one tracked batch's life (issue 48), counted from the items.
    result["index_writes_per_job"] = bench_calls.index_writes_per_job(
        store,
        lambda name: store.client.get_item(
            TableName=store.table_name, Key={"name": {"S": name}}, ConsistentRead=True
        ).get("Item"),
        "calls",
    )
    return result


def section_contention(size: dict[str, int], tmp: Path, moto: Any) -> dict[str, Any]:
    """On DynamoDB (moto server: real round trips, so writers really interleave), with SQLite
    beside it under ``sqlite``."""
    from opstate.store.sqlite import SQLiteStore
    from tests.support.stores import CountingStore

    client, new_store = moto
    counter = bench_calls.ApiCallCounter(client)
    result = bench_ingest.contention(new_store(), "hot", size["contention_moto"], counter.total)
    result["store"] = "DynamoDBStore on moto server (DynamoDB API calls)"
    store = CountingStore(SQLiteStore(tmp / "contention.db"))
    try:
        sqlite = bench_ingest.contention(store, "hot", size["contention"], store.total)
    finally:
        store.close()
    sqlite["store"] = "SQLiteStore (store port calls)"
    result["sqlite"] = sqlite
    return result


def section_seed(size: dict[str, int]) -> dict[str, Any]:
    return seed_compare.compare(size["seed_ops"]).as_dict()


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


Row = Callable[[str, Any, Any, Any, str], None]


def _ingest_rows(ing: dict[str, Any], row: Row) -> None:
    for store in ("sqlite", "moto"):
        r = ing.get(store)
        if isinstance(r, dict) and "ratio" in r:
            ok = "ok" if r["ratio"] >= TARGETS["ingest_ratio"] else "MISSED"
            row(
                f"ingest {store}: handler vs bare get+put (ev/s)",
                r["handler_eps"],
                r["bare_eps"],
                r["ratio"],
                f">= 0.67 {ok}",
            )


def _hotpath_rows(hot: dict[str, Any], row: Row) -> None:
    if "ratio" in hot:
        ok = "ok" if hot["ratio"] >= TARGETS["hotpath_ratio"] else "MISSED"
        row(
            "webhook hot path: bare floor vs handler (us/delivery)",
            hot["handler_us"],
            hot["floor_us"],
            hot["ratio"],
            f">= {TARGETS['hotpath_ratio']} {ok}",
        )


def _calls_rows(calls: dict[str, Any], row: Row) -> None:
    for key, limit in (("new", 1), ("advancing", 1), ("duplicate", 1), ("contended", 3)):
        if key in calls:
            ok = "ok" if calls[key] <= limit else "MISSED"
            row(f"DynamoDB calls per event: {key}", calls[key], "", "", f"<= {limit} {ok}")
    index = calls.get("index_writes_per_job")
    if index:
        by_index = ", ".join(f"{k} {v}" for k, v in sorted(index["by_index"].items()))
        row(f"DynamoDB index writes per job ({by_index})", index["total"], "", "", "")


def _contention_rows(con: dict[str, Any], row: Row) -> None:
    if "lost" not in con:
        return
    row(
        f"contention DynamoDB {con['threads']}x1 op, {con['events']} events: lost",
        con["lost"],
        "",
        "",
        "== 0 " + ("ok" if con["lost"] == 0 else "MISSED"),
    )
    row("contention: gave-up answers (503, retried)", con["gave_up"], "", "", "")
    row("contention: DynamoDB calls per event", con["calls_per_event"], "", "", "<= 3")
    sq = con.get("sqlite")
    if isinstance(sq, dict):
        row(
            f"contention SQLite 8x1 op, {sq['events']} events: lost / gave-up",
            f"{sq['lost']} / {sq['gave_up']}",
            "",
            "",
            "lost == 0 " + ("ok" if sq["lost"] == 0 else "MISSED"),
        )


def _cold_rows(cold: dict[str, Any], row: Row) -> None:
    if "webhook_ms" not in cold:
        return
    limit = TARGETS["webhook_cold_ratio"]
    for unit, key in (("ms", ""), ("CPU ms", "_cpu")):
        if f"webhook{key}_ratio" in cold:
            ok = "ok" if cold[f"webhook{key}_ratio"] <= limit else "MISSED"
            row(
                f"cold start webhook vs boto3 client ({unit})",
                cold[f"webhook{key}_ms"],
                cold[f"baseline{key}_ms"],
                cold[f"webhook{key}_ratio"],
                f"<= {limit} {ok}",
            )
    row(
        "cold start reconciler vs boto3 client (ms)",
        cold["reconciler_ms"],
        cold["baseline_ms"],
        cold["reconciler_ratio"],
        "",
    )


def _container_rows(container: dict[str, Any], row: Row) -> None:
    if "skipped" in container:
        row(f"cold start in a container: NOT MEASURED ({container['skipped']})", "", "", "", "")
    for name, fn in container.get("functions", {}).items():
        for mb, cell in fn["by_memory"].items():
            mark = " (configured)" if int(mb) == fn["configured_mb"] else ""
            row(
                f"container init {name} {mb} MB ({cell['cpus']} vCPU){mark}: pyc vs source (ms)",
                cell["bytecode_ms"],
                cell["source_ms"],
                round(1 / cell["speedup"], 2),
                f"<= {fn['target_ms']:.0f}"
                + (" ok" if cell["bytecode_ms"] <= fn["target_ms"] else " MISSED")
                if mark
                else "",
            )
            if "bytecode_cpu_ms" in cell:
                row(
                    f"  the same, CPU time (ms; / {cell['cpus']} = the quota alone)",
                    cell["bytecode_cpu_ms"],
                    cell["source_cpu_ms"],
                    round(cell["bytecode_cpu_ms"] / cell["source_cpu_ms"], 2),
                    "",
                )


def _seed_rows(seed: dict[str, Any], row: Row) -> None:
    if "seed_wrong" not in seed:
        return
    ok = "ok" if seed["ours_wrong"] == 0 and seed["ours_lost"] == 0 else "MISSED"
    row(
        f"seed vs ours, {seed['operations']} ops: wrong final states",
        seed["ours_wrong"],
        seed["seed_wrong"],
        "",
        f"ours == 0 {ok}",
    )
    row(
        f"seed vs ours, {seed['deliveries']} deliveries: lost events",
        seed["ours_lost"],
        seed["seed_lost"],
        "",
        f"ours == 0 {ok}",
    )
    row("seed: 200 after max-retry-exceeded", "", seed["seed_max_retry_acks"], "", "")


def _scale_rows(scale: Any, row: Row) -> None:
    for store in ("sqlite", "moto"):
        got = scale.get(store) if isinstance(scale, dict) else None
        if isinstance(got, dict) and "requests" in got:
            _scale_store_rows(store, got, row)


def _scale_store_rows(store: str, got: dict[str, Any], row: Row) -> None:
    label = f"reconcile {store}, {got['ops']} ops / {got['hours']:g} h"
    ok = "ok" if got["reduction"] >= 5 else "MISSED"
    row(
        f"{label}: Gemini requests/op-hour",
        got["requests_per_op_hour"],
        got["baseline_per_op_hour"],
        got["reduction"],
        f">= 5x fewer {ok}",
    )
    ok = "ok" if got["over_schedule"] == 0 and got["starved"] == 0 else "MISSED"
    row(
        f"{label}: over schedule+2 runs / starved",
        f"{got['over_schedule']} / {got['starved']}",
        "",
        f"max {got['max_delay_runs']} runs",
        f"0 / 0 {ok}",
    )
    scans = got.get("scans", 0)
    row(
        f"{label}: store calls per poll, s per run",
        got["store_calls_per_poll"],
        "",
        f"{got['seconds_per_run_mean']} s (max {got['seconds_per_run_max']})",
        f"scans {scans} {'ok' if scans == 0 else 'MISSED'}",
    )


def _aligned(rows: list[tuple[str, str, str, str, str]]) -> list[str]:
    """The rows under a header, each column padded to its widest cell."""
    header = ("measure", "ours", "reference", "ratio", "target")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return lines


def _notes(results: dict[str, Any], ing: Any) -> list[str]:
    """The lines under the table: the SQLite handler's breakdown, the sections not measured."""
    lines: list[str] = []
    parts = ing.get("sqlite", {}).get("breakdown") if isinstance(ing, dict) else None
    if isinstance(parts, dict):
        lines.append(
            "sqlite handler, us/event: "
            + ", ".join(f"{k.removesuffix('_us')} {v:,.0f}" for k, v in parts.items())
        )
    for section, value in results.items():
        if isinstance(value, dict) and "error" in value:
            lines.append(f"{section}: NOT MEASURED ({value['error']})")
    return lines


def table(results: dict[str, Any]) -> list[str]:
    """The results as an aligned text table, one row per measure, then notes."""
    rows: list[tuple[str, str, str, str, str]] = []

    def row(what: str, ours: Any, ref: Any, ratio: Any, target: str) -> None:
        rows.append((what, _fmt(ours), _fmt(ref), _fmt(ratio), target))

    ing = results.get("ingest", {})
    _ingest_rows(ing, row)
    _hotpath_rows(results.get("hotpath", {}), row)
    _calls_rows(results.get("calls_per_event", {}), row)
    _contention_rows(results.get("contention", {}), row)
    _cold_rows(results.get("cold_start", {}), row)
    _container_rows(results.get("cold_start_container", {}), row)
    _seed_rows(results.get("seed_baseline", {}), row)
    _scale_rows(results.get("reconcile_scale", {}), row)
    _archive_rows(results.get("archive", {}), row)
    _archive_rows(results.get("archive_short_rows", {}), row)
    bench_retry_file.table_rows(results.get("retry_file", {}), row)
    bench_aws_cost.table_rows(results.get("aws_cost", {}), row)
    return _aligned(rows) + _notes(results, ing)


def _archive_rows(got: dict[str, Any], row: Row) -> None:
    if "ratio" not in got:
        return
    label = f"archive {got['mib']:g} MiB batch output ({got['row_bytes']} B rows)"
    ok = "ok" if got["ratio"] >= bench_archive.RATIO_TARGET else "MISSED"
    row(
        f"{label}: MiB/s vs plain httpx copy",
        got["archive_mib_s"],
        got["plain_mib_s"],
        got["ratio"],
        f">= {bench_archive.RATIO_TARGET} {ok}",
    )
    ok = "ok" if got["archive_rss_added_mib"] <= bench_archive.RSS_TARGET_MIB else "MISSED"
    row(
        f"{label}: peak RSS added (MiB)",
        got["archive_rss_added_mib"],
        got["plain_rss_added_mib"],
        "",
        f"<= {bench_archive.RSS_TARGET_MIB} {ok}",
    )
    row(f"{label}: ledger alone (MiB/s, CPU only)", got["ledger_only_mib_s"], "", "", "")
    row(
        f"{label}: ledger CPU ms/MiB, msgspec vs stdlib",
        got["ledger_ms_per_mib"],
        got["ledger_stdlib_ms_per_mib"],
        round(got["ledger_ms_per_mib"] / got["ledger_stdlib_ms_per_mib"], 3),
        "",
    )


def section_reconcile(size: dict[str, int]) -> dict[str, Any]:
    """The reconciler over a simulated 24 h (``reconcile_scale.py``) on SQLite and DynamoDB."""
    ops = size["reconcile_ops"]
    return {
        "sqlite": reconcile_scale.measure("sqlite", ops),
        "moto": reconcile_scale.measure("moto", ops),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes: under a minute")
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=[
            "ingest",
            "hotpath",
            "calls",
            "contention",
            "cold",
            "cold-container",
            "seed",
            "reconcile",
            "archive",
            "retry",
            "aws-cost",
        ],
    )
    args = parser.parse_args(argv)
    size = SIZES[args.quick]
    started = time.perf_counter()
    results: dict[str, Any] = {
        "meta": {
            "mode": "quick" if args.quick else "full",
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "sizes": size,
            "targets": TARGETS,
        }
    }

    def run(section: str, key: str, fn: Callable[[], dict[str, Any]]) -> None:
        if section in args.skip:
            return
        t0 = time.perf_counter()
        print(f"[bench] {section} ...", file=sys.stderr, flush=True)
        try:
            results[key] = fn()
        except Exception as exc:  # report, never hide, a section that could not run
            results[key] = {"error": f"{type(exc).__name__}: {exc}"}
        if isinstance(results[key], dict):
            results[key]["section_seconds"] = round(time.perf_counter() - t0, 2)

    with tempfile.TemporaryDirectory(prefix="opstate-bench-") as tmpdir:
        tmp = Path(tmpdir)
        need_moto = not {"ingest", "calls", "contention"} <= set(args.skip)
        if need_moto:
            with moto_dynamodb() as moto:
                run("ingest", "ingest", lambda: section_ingest(size, tmp, moto))
                run("calls", "calls_per_event", lambda: section_calls(size, moto))
                run("contention", "contention", lambda: section_contention(size, tmp, moto))
        run("seed", "seed_baseline", lambda: section_seed(size))
    run("hotpath", "hotpath", lambda: bench_hotpath.measure(size["hotpath_n"], size["rounds"]))
    run("cold", "cold_start", lambda: bench_cold.measure(size["cold_rounds"]))
    # The same init under Lambda's CPU share, in a container (needs Docker; says so otherwise).
    run(
        "cold-container",
        "cold_start_container",
        lambda: cold_container.measure(
            size["container_rounds"],
            cold_container.MEMORY_SIZES if not args.quick else (cold_container.FULL_VCPU_MB,),
        ),
    )
    run("reconcile", "reconcile_scale", lambda: section_reconcile(size))
    run(
        "archive",
        "archive",
        lambda: bench_archive.measure(64 if args.quick else 1024, rounds=1 if args.quick else 3),
    )
    # The ledger's cost is per row: the same with ~1 KB rows (a short answer).
    run(
        "archive",
        "archive_short_rows",
        lambda: bench_archive.measure(
            64 if args.quick else 1024, rounds=1 if args.quick else 3, text=900
        ),
    )
    # Attempt 1's file work on a 100,000-row batch (issue 33): RSS added <= 64 MiB.
    run(
        "retry",
        "retry_file",
        lambda: bench_retry_file.measure(
            20_000 if args.quick else 100_000, rounds=1 if args.quick else 3
        ),
    )
    # What running opstate costs on AWS (issue 41): a simulated day through the functions.
    run(
        "aws-cost",
        "aws_cost",
        lambda: bench_aws_cost.measure(bench_aws_cost.QUICK if args.quick else bench_aws_cost.FULL),
    )
    results["meta"]["seconds"] = round(time.perf_counter() - started, 1)

    args.out.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    print("\n".join(table(results)))
    print(f"\n{results['meta']['mode']} run, {results['meta']['seconds']} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
