"""What running opstate costs on AWS: a simulated day through the real functions on moto,
every AWS request counted and priced (issue 41, part 3); beside it the same jobs as a Step
Functions job poller would run them.

The day (``--batches`` batch jobs and ``--videos`` Veo operations, 120 and 12 by default (see
``FULL``), started uniformly over the first 18 h, a retry lineage for every 20th batch):

- each job is created on the fake Gemini (``tests/support/fake_gemini.py``) and tracked with
  ``PUT /operations/{name}`` through the webhook function (every 20th with a retry policy and
  its input under ``incoming/`` of the results bucket);
- it finishes after a drawn duration (batches: lognormal, median 30 min, sigma 1, capped at
  5 h; videos: 1-4 min; retry children: like batches); its output is put on the fake and a
  signed ``batch.succeeded`` / ``video.generated`` delivery (Standard Webhooks, the configured
  secret) goes through the webhook function 2 s later, 3 % of them delivered twice;
- the reconciler runs at the template's schedule (``rate(ReconcileRateMinutes)``, 5 min) with
  the template's settings (discovery on: 5 pages of batches listed per run);
- after every invocation the operations table's stream is read and handed to the notifier in
  batches of 25 (the mapping's BatchSize), and to the waiter resumer where its filter
  matches; every ``PutEvents`` entry is routed by the template's rules (terminal changes to
  the archiver, the five resumable detail-types to the resumer); the reconciler's re-drive
  (``lambda:Invoke`` of the archiver) is answered in process and run as an invocation.

Each function is the real ``functions/<name>/app.py`` entry, loaded once (its init timed),
called with the template's environment (secrets given as plain variables, so Secrets Manager
calls are not counted: its per-secret fee is priced as a fixed monthly cost), on one process
whose clock is moved through the simulated day with ``time_machine`` (so every time the code
reads - a report's time, a poll's due time, a signature's timestamp - is the day's); durations
are measured with the real monotonic clock. AWS is a moto server on 127.0.0.1.

Counting: a botocore ``before-call`` hook on every client the code makes counts each request
per function, service and operation, and an ``after-call`` hook sizes DynamoDB reads; written
units come from the stream's old and new images (``aws_prices``: computed from item sizes, not
from ReturnConsumedCapacity). Lambda GB-seconds: each invocation's wall time, rounded up to
the ms, x the template's MemorySize, plus a modelled 50 ms per Gemini request (the fake answers
in about a millisecond; the reconciler's requests are spread over its 8 workers), the same
latency the Step Functions poller's Lambda is given. Logs: the bytes each invocation wrote, plus
the lines Lambda itself writes for it (START/END/REPORT, INIT_START on a cold start, or their
JSON forms, as the function's ``LoggingConfig`` and ``SystemLogLevel`` send them:
``lambda_logs.py``). The libraries' lines are not written here, as in Lambda, where the runtime's
root logger stays at WARNING (``opstate.lambda_logging``; tests/e2e/test_built_logging.py).

Scaled outputs: a batch's output is 10 MB; the day writes them at 1/``--scale`` of that (and
4 MB videos likewise), and S3 GB-month is computed from the unscaled sizes. A 10 MB object is
a 2-part upload and a multipart copy where a small one is not, so a calibration archives a
few full 10 MB outputs and as many scaled ones after the day, and the difference per archive
(S3 requests by operation, archiver milliseconds) is added for each 10 MB output of the day.

The stack is the template's defaults with ``DEPLOY_PARAMETERS`` (``RetryOverApi=true``: the
day attaches retry policies with ``PUT /operations``) and any ``--parameter NAME=VALUE``;
``--discover all|tracked`` sets the reconciler's ``OPSTATE_DISCOVER``. The month's fixed cost
(custom metrics the day sent, alarm metrics, dashboards and secrets of the deployed template:
``fixed_costs.py``) and the peer designs for the same jobs (``peers.py``: a Step Functions
poller at 30 s and at 5 minutes, a Standard workflow waiting for a callback, a Lambda durable
function waiting on a callback, each with the receiver of Gemini's webhook) are priced beside
the day (issue 48).

Run: ``.venv/bin/python benchmarks/bench_aws_cost.py [--quick] [--json] [--discover all|tracked]
[--batches N --videos N] [--parameter NAME=VALUE ...]``; ``run.py`` runs it as section
``aws-cost`` (key ``aws_cost``); ``tests/integration/test_bench_aws_cost_quick.py`` runs
``--quick`` in ``make test``.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import importlib.util
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _entry in (str(HERE), str(ROOT / "layers" / "opstate"), str(ROOT)):
    if _entry not in sys.path:
        sys.path.insert(0, _entry)
for _key, _value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "POWERTOOLS_TRACE_DISABLED": "true",
}.items():
    os.environ[_key] = _value
os.environ.pop("AWS_PROFILE", None)

import aws_prices as P  # noqa: E402
import fixed_costs  # noqa: E402
import lambda_logs  # noqa: E402
import peers  # noqa: E402

S = 1_000_000_000
DAY_START_S = 1_790_208_000  # 2026-09-24T00:00:00Z
BUCKET = "opstate-results-bench"
STACK = "opstate-bench"
MODEL = "models/gemini-2.5-flash"
OUTPUT_BYTES = 10_000_000
VIDEO_BYTES = 4_000_000
GEMINI_LATENCY_MS = 50.0
RECONCILE_WORKERS = 8  # the reconciler's poll workers (its default concurrency)
# The sensitivity model beside the measured wall time: this process's CPU time, stretched by
# Lambda's CPU share (1,769 MB = one vCPU), plus this latency per AWS request.
AWS_LATENCY_MS = 5.0
FULL_VCPU_MB = 1769
POLL_PERIOD_S = 30.0
POLLER_MEMORY_MB = 128
DUPLICATE_SHARE = 0.03
STREAM_BATCH = 25
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
RESUMER_TYPES = (
    "Operation State Changed",
    "Operation Lost",
    "Operation Results Archived",
    "Operation Results Lost",
    "Operation Results Final",
)
# The stack's parameter overrides (``sam deploy --parameter-overrides``): the day attaches a
# retry policy to every 20th job with PUT /operations, which only a stack deployed with
# RetryOverApi=true allows (the retry right of 0.6.0: otherwise 403 retry-not-allowed).
# Every other parameter keeps its default.
DEPLOY_PARAMETERS: dict[str, str] = {"RetryOverApi": "true"}
# logical id -> short name (the label everything is counted under)
FUNCTIONS = {
    "WebhookFunction": "webhook",
    "ReconcileFunction": "reconcile",
    "NotifyFunction": "notify",
    "ArchiverFunction": "archiver",
    "WaiterResumerFunction": "waiters",
}
ENTRY_DIRS = {
    "webhook": "webhook",
    "reconcile": "reconcile",
    "notify": "notify",
    "archiver": "archiver",
    "waiters": "waiters",
}


@dataclass(frozen=True)
class Sizes:
    batches: int
    videos: int
    hours: float
    start_within_h: float
    lineage_every: int
    scale: int
    calibration: int


# A full run: the template's whole day of reconciler runs (288) with 120 batches and 12 videos
# (430 s on the shared 2-core machine of docs/bench.md); a day of 1,000 + 100 is
# --batches 1000 --videos 100. Quick: 3 hours, 20 batches, 2 videos (55 s there).
FULL = Sizes(120, 12, 24.0, 18.0, 20, 50, 2)
QUICK = Sizes(20, 2, 3.0, 2.0, 20, 50, 1)


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- counting every AWS request ----------------------------------------------------------------


class Meter:
    """Counts every botocore request per (label, service, operation); sizes DynamoDB reads;
    answers ``lambda:Invoke`` in process (queued for the harness) and keeps ``PutEvents``
    entries for routing."""

    def __init__(self) -> None:
        self.label = "harness"
        self.lock = threading.Lock()
        self.calls: Counter[tuple[str, str, str]] = Counter()
        self.rru: defaultdict[str, float] = defaultdict(float)
        self.wru: Counter[str] = Counter()
        self.gsi_wru: Counter[str] = Counter()
        # Index write units per (label, index), for what archiving causes (``archiving_usd``).
        self.gsi_by_index: Counter[tuple[str, str]] = Counter()
        self.events: list[dict[str, Any]] = []
        self.invokes: list[tuple[str, bytes]] = []

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-parameter-build", self._params)
        client.meta.events.register("before-call", self._before)
        client.meta.events.register("after-call", self._after)

    @staticmethod
    def _params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["bench_params"] = dict(params)

    def _before(self, model: Any, context: dict[str, Any], **_: Any) -> Any:
        service, operation = model.service_model.service_name, model.name
        params = context.get("bench_params", {})
        with self.lock:
            self.calls[(self.label, service, operation)] += 1
            if service == "events" and operation == "PutEvents" and self.label != "harness":
                self.events.extend(params.get("Entries", []))
            if service == "lambda" and operation == "Invoke":
                payload = params.get("Payload", b"")
                if isinstance(payload, str):
                    payload = payload.encode()
                self.invokes.append((str(params.get("FunctionName")), bytes(payload)))
                from botocore.awsrequest import AWSResponse, HTTPHeaders

                return AWSResponse("", 202, HTTPHeaders(), None), {"StatusCode": 202}
        return None

    def _after(self, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        if model.service_model.service_name != "dynamodb" or self.label == "harness":
            return
        params = context.get("bench_params", {})
        operation = model.name
        consistent = bool(params.get("ConsistentRead"))
        units = 0.0
        if operation == "GetItem" and "Error" not in parsed:
            units = P.read_units(P.item_size(parsed.get("Item")), consistent=consistent)
        elif operation in ("Query", "Scan") and "Error" not in parsed:
            size = sum(P.item_size(i) for i in parsed.get("Items", []))
            units = P.read_units(size, consistent=consistent)
        elif operation == "BatchGetItem":
            for items in parsed.get("Responses", {}).values():
                units += sum(P.read_units(P.item_size(i), consistent=consistent) for i in items)
        elif operation == "TransactGetItems":
            for got in parsed.get("Responses", []):
                units += 2 * P.read_units(P.item_size(got.get("Item")), consistent=True)
        code = parsed.get("Error", {}).get("Code", "")
        with self.lock:
            self.rru[self.label] += units
            if code == "ConditionalCheckFailedException":
                # The failed condition still costs the units of the item it was checked against.
                self.wru[self.label] += P.write_units(P.item_size(parsed.get("Item")), 0)

    def take_events(self) -> list[dict[str, Any]]:
        with self.lock:
            out, self.events = self.events, []
        return out

    def take_invokes(self) -> list[tuple[str, bytes]]:
        with self.lock:
            out, self.invokes = self.invokes, []
        return out


METER = Meter()


def install_meter() -> None:
    """Every botocore client created from now on is counted."""
    import botocore.session

    original = botocore.session.Session.create_client
    if getattr(original, "_bench_metered", False):
        return

    def create_client(self: Any, *args: Any, **kwargs: Any) -> Any:
        client = original(self, *args, **kwargs)
        METER.attach(client)
        return client

    create_client._bench_metered = True  # type: ignore[attr-defined]
    botocore.session.Session.create_client = create_client  # type: ignore[method-assign]


@contextlib.contextmanager
def labelled(label: str) -> Iterator[None]:
    before = METER.label
    METER.label = label
    try:
        yield
    finally:
        METER.label = before


@contextlib.contextmanager
def captured_output() -> Iterator[list[bytes]]:
    """Everything written to file descriptors 1 and 2 (what Lambda sends to CloudWatch Logs)."""
    out: list[bytes] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield out
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            out.append(sink.read())


# --- the template ------------------------------------------------------------------------------


def template_config(refs: dict[str, str]) -> tuple[dict[str, str], dict[str, int], dict[str, Any]]:
    """(the functions' environment, union of the template's; MemorySize per function; facts
    for the fixed costs and the schedule)."""
    from tests.e2e.harness import BuiltTemplate, UnresolvableError

    tpl = BuiltTemplate.load(ROOT / "template.yaml")
    env: dict[str, str] = {}
    memory: dict[str, int] = {}
    logging_settings: dict[str, lambda_logs.LogSettings] = {}
    for logical, short in FUNCTIONS.items():
        for key, value in tpl.environment(logical).items():
            try:
                env[key] = tpl.resolve(value, refs)
            except UnresolvableError:
                continue
        memory[short] = int(tpl.resolve(tpl.function_setting(logical, "MemorySize"), refs))
        config = tpl.function_setting(logical, "LoggingConfig") or {}
        tracing = tpl.function_setting(logical, "Tracing")
        logging_settings[short] = lambda_logs.settings_of(
            {key: tpl.resolve(value, refs) for key, value in config.items()},
            tpl.resolve(tracing, refs) if tracing is not None else None,
        )
    rate = int(tpl.parameter_default("ReconcileRateMinutes"))
    parameters = {k: v for k, v in refs.items() if k in tpl.data.get("Parameters", {})}
    facts = {
        "template": tpl.data,
        "parameters": parameters,
        "reconcile_rate_minutes": rate,
        "logging": logging_settings,
        "architecture": tpl.parameter_default("Architecture"),
        "operations_indexes": [
            [k["AttributeName"] for k in gsi["KeySchema"]]
            for gsi in tpl.resources["OperationsTable"]["Properties"]["GlobalSecondaryIndexes"]
        ],
    }
    return env, memory, facts


# --- the functions -----------------------------------------------------------------------------


@dataclass
class Invocation:
    function: str
    label: str
    ms: float
    gemini_requests: int
    log_bytes: int
    hour: int
    cpu_ms: float = 0.0
    aws_requests: int = 0


@dataclass
class Functions:
    memory: dict[str, int]
    fake: Any
    modules: dict[str, ModuleType] = field(default_factory=dict)
    init_ms: dict[str, float] = field(default_factory=dict)
    invocations: list[Invocation] = field(default_factory=list)
    suffix: str = ""
    log_lines: list[bytes] = field(default_factory=list)
    log_messages: Counter[tuple[str, str]] = field(default_factory=Counter)

    def entry(self, short: str) -> ModuleType:
        if short not in self.modules:
            path = ROOT / "functions" / ENTRY_DIRS[short] / "app.py"
            spec = importlib.util.spec_from_file_location(f"bench_cost_{short}_app", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            started = time.perf_counter()
            with labelled(short), captured_output():
                spec.loader.exec_module(module)
            self.init_ms[short] = (time.perf_counter() - started) * 1000
            self.modules[short] = module
        return self.modules[short]

    def invoke(self, short: str, event: dict[str, Any], timeout_s: float) -> Any:
        from opstate.local.apigw import LocalLambdaContext

        handler = self.entry(short).lambda_handler
        context = LocalLambdaContext(
            function_name=f"{STACK}-{short}",
            memory_limit_in_mb=self.memory[short],
            aws_request_id=str(uuid.uuid4()),
            remaining_ms=int(timeout_s * 1000),
        )
        label = short + self.suffix
        gemini_before = len(self.fake.requests)
        aws_before = requests_of(label)
        with labelled(label), captured_output() as out:
            started, cpu = time.perf_counter(), time.process_time()
            try:
                result = handler(event, context)
            finally:
                ms = (time.perf_counter() - started) * 1000
                cpu_ms = (time.process_time() - cpu) * 1000
        logs = out[0] if out else b""
        for line in logs.splitlines():
            if b'"_aws"' in line:
                self.log_lines.append(line)
            elif not self.suffix:
                self.log_messages[(short, _message(line))] += 1
        self.invocations.append(
            Invocation(
                short,
                label,
                ms,
                len(self.fake.requests) - gemini_before,
                len(logs),
                int((time.time() - DAY_START_S) // 3600),
                cpu_ms,
                requests_of(label) - aws_before,
            )
        )
        return result


def new_containers() -> None:
    """The hourly cold start the day's init cost assumes, for what a container keeps in
    memory: the reconciler's re-drive and discovery cadences and discovery's settled records
    start afresh (a new container looks, lists and reads at once)."""
    module = sys.modules.get("opstate.wiring.reconcile")
    if module is not None:
        module.new_container()


def requests_of(label: str) -> int:
    with METER.lock:
        return sum(n for (lab, _, _), n in METER.calls.items() if lab == label)


def _message(line: bytes) -> str:
    """A log line's level and message (Powertools' JSON), for the log volume by message."""
    try:
        doc = json.loads(line)
    except ValueError:
        return "(not JSON)"
    if not isinstance(doc, dict):
        return "(not JSON)"
    return f"{doc.get('level', '?')} {str(doc.get('message', ''))[:60]}"


# --- the stream --------------------------------------------------------------------------------


class Stream:
    """The operations table's stream, read from where the last read stopped, shaped as Lambda
    delivers records (epoch-seconds creation time, ``eventSourceARN``)."""

    def __init__(self, ddb: Any, streams: Any, table: str) -> None:
        self.streams = streams
        self.arn = ddb.describe_table(TableName=table)["Table"]["LatestStreamArn"]
        self.iterators: dict[str, str | None] = {}
        self.records = 0

    def read(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        shards = self.streams.describe_stream(StreamArn=self.arn)["StreamDescription"]["Shards"]
        for shard in shards:
            sid = shard["ShardId"]
            if sid not in self.iterators:
                self.iterators[sid] = self.streams.get_shard_iterator(
                    StreamArn=self.arn, ShardId=sid, ShardIteratorType="TRIM_HORIZON"
                )["ShardIterator"]
            while self.iterators[sid]:
                page = self.streams.get_records(ShardIterator=self.iterators[sid], Limit=1000)
                self.iterators[sid] = page.get("NextShardIterator")
                if not page["Records"]:
                    break
                for raw in page["Records"]:
                    record = dict(raw)
                    created = record["dynamodb"].get("ApproximateCreationDateTime")
                    if created is not None and hasattr(created, "timestamp"):
                        record["dynamodb"] = {
                            **record["dynamodb"],
                            "ApproximateCreationDateTime": created.timestamp(),
                        }
                    record["eventSourceARN"] = self.arn
                    out.append(record)
        self.records += len(out)
        delivered: list[dict[str, Any]] = json.loads(json.dumps(out, default=str))
        return delivered


# --- the simulated day -------------------------------------------------------------------------


@dataclass
class Job:
    name: str
    kind: str  # batch | video | child
    start_s: float
    duration_s: float
    lineage: bool = False
    full_size: bool = False


@dataclass
class Day:
    sizes: Sizes
    functions: Functions
    fake: Any
    s3: Any
    stream: Stream
    indexes: list[list[str]]
    secret: str
    rng: random.Random
    queue: list[tuple[float, int, str, Any]] = field(default_factory=list)
    seq: int = 0
    traveller: Any = None
    jobs: dict[str, Job] = field(default_factory=dict)
    children_seen: set[str] = field(default_factory=set)
    outputs: dict[str, bytes] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    stream_records: Counter[str] = field(default_factory=Counter)
    http_requests: int = 0
    scheduler_invocations: int = 0
    event_entries: list[int] = field(default_factory=list)
    event_types: Counter[str] = field(default_factory=Counter)
    webhook_errors: int = 0
    day_counts: Counter[str] = field(default_factory=Counter)

    # -- plumbing ------------------------------------------------------------------------------

    def at(self, t_s: float, kind: str, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (t_s, self.seq, kind, payload))

    def travel(self, t_s: float) -> None:
        if t_s > time.time():
            self.traveller.move_to(t_s)

    def invoke(self, short: str, event: dict[str, Any], timeout_s: float) -> Any:
        result = self.functions.invoke(short, event, timeout_s)
        self.drain_stream(short + self.functions.suffix)
        return result

    def drain_stream(self, label: str) -> None:
        with labelled("harness"):
            records = self.stream.read()
        for record in records:
            image = record["dynamodb"]
            old, new = image.get("OldImage"), image.get("NewImage")
            METER.wru[label] += P.write_units(P.item_size(old), P.item_size(new))
            METER.gsi_wru[label] += P.gsi_write_units(old, new, self.indexes)
            for keys in self.indexes:
                METER.gsi_by_index[(label, keys[0])] += P.gsi_write_units(old, new, [keys])
        self.stream_records[label] += len(records)
        self.pending.extend(records)

    pending: list[dict[str, Any]] = field(default_factory=list)

    def settle(self) -> None:
        """Run everything the last change set off: stream -> notifier (and the resumer's
        filtered mapping), bus entries -> archiver / resumer, re-drives -> archiver."""
        while True:
            progressed = False
            while self.pending:
                batch, self.pending = self.pending[:STREAM_BATCH], self.pending[STREAM_BATCH:]
                self.invoke("notify", {"Records": batch}, 30)
                settled = [r for r in batch if _archive_settled(r)]
                if settled:
                    self.invoke("waiters", {"Records": settled}, 30)
                progressed = True
            for entry in METER.take_events():
                progressed = True
                self.route(entry)
            for _, payload in METER.take_invokes():
                progressed = True
                self.invoke("archiver", json.loads(payload or b"{}"), 900)
                self.find_children()
            if not progressed:
                return

    def route(self, entry: dict[str, Any]) -> None:
        raw = json.dumps(entry).encode()
        if not self.functions.suffix:  # the calibration's entries are not the day's
            self.event_entries.append(P.chunks(len(raw), P.EVENTBRIDGE_CHUNK_BYTES))
            self.event_types[str(entry.get("DetailType"))] += P.chunks(
                len(raw), P.EVENTBRIDGE_CHUNK_BYTES
            )
        detail = json.loads(entry.get("Detail") or "{}")
        envelope = {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": entry.get("DetailType"),
            "source": entry.get("Source"),
            "account": "123456789012",
            "time": rfc3339(time.time()),
            "region": "us-east-1",
            "resources": entry.get("Resources", []),
            "detail": detail,
        }
        if entry.get("Source") != "gemini-opstate":
            return
        kind = entry.get("DetailType")
        if kind == "Operation State Changed" and detail.get("state") in TERMINAL:
            self.invoke("archiver", envelope, 900)
            self.find_children()
        if kind in RESUMER_TYPES:
            self.invoke("waiters", envelope, 30)

    def find_children(self) -> None:
        for name in self.fake.batches_created():
            if name in self.children_seen:
                continue
            self.children_seen.add(name)
            job = Job(name, "child", time.time(), self.batch_duration())
            self.jobs[name] = job
            self.at(job.start_s + job.duration_s, "finish", job)

    # -- the workload --------------------------------------------------------------------------

    def batch_duration(self) -> float:
        return min(5 * 3600.0, 1800.0 * math.exp(self.rng.gauss(0.0, 1.0)))

    def plan(self) -> None:
        sizes = self.sizes
        for i in range(sizes.batches):
            start = DAY_START_S + self.rng.uniform(0, sizes.start_within_h * 3600)
            job = Job(
                f"batches/bench-{i:05d}",
                "batch",
                start,
                self.batch_duration(),
                lineage=(i % sizes.lineage_every == sizes.lineage_every - 1),
            )
            self.jobs[job.name] = job
            self.at(start, "submit", job)
        for i in range(sizes.videos):
            start = DAY_START_S + self.rng.uniform(0, sizes.start_within_h * 3600)
            name = f"models/veo-3.1-generate-preview/operations/bench-{i:04d}"
            job = Job(name, "video", start, self.rng.uniform(60, 240))
            self.jobs[name] = job
            self.at(start, "submit", job)
        every = 60.0 * self.rate_minutes
        for n in range(int(sizes.hours * 3600 // every)):
            self.at(DAY_START_S + n * every + 1, "reconcile", None)

    rate_minutes: int = 5

    def run(self) -> None:
        handlers: dict[str, Callable[[Any], None]] = {
            "submit": self.submit,
            "finish": self.finish,
            "webhook": self.webhook,
            "reconcile": self.reconcile,
        }
        end = DAY_START_S + self.sizes.hours * 3600
        hour, started = 0, time.perf_counter()
        while self.queue:
            t, _, kind, payload = heapq.heappop(self.queue)
            if t >= end and kind != "webhook":
                continue
            if int((t - DAY_START_S) // 3600) > hour:
                hour = int((t - DAY_START_S) // 3600)
                self.progress(hour, time.perf_counter() - started)
                new_containers()
            self.travel(t)
            handlers[kind](payload)
            self.settle()

    def progress(self, hour: int, wall_s: float) -> None:
        """One line on stderr per simulated hour: the counts so far (a day cut short by a
        deadline still says how far it got and what it had counted)."""
        mine = [i for i in self.functions.invocations if i.function == "reconcile"]
        with METER.lock:
            rru = sum(v for k, v in METER.rru.items() if k != "harness" and "@" not in k)
            wru = sum(v for k, v in METER.wru.items() if k != "harness" and "@" not in k)
            gsi = sum(v for k, v in METER.gsi_wru.items() if k != "harness" and "@" not in k)
        so_far = {
            "hour": hour,
            "wall_s": round(wall_s),
            "jobs": self.counts["submitted_batch"] + self.counts["submitted_video"],
            "counts": dict(self.counts),
            "reconcile_runs": len(mine),
            "reconcile_cpu_ms": round(sum(i.cpu_ms for i in mine)),
            "rru": round(rru, 1),
            "wru_table": round(wru, 1),
            "wru_indexes": round(gsi, 1),
            "events": sum(self.event_entries),
        }
        print(json.dumps(so_far), file=sys.stderr, flush=True)

    def submit(self, job: Job) -> None:
        now = time.time()
        body: dict[str, Any] = {}
        if job.kind == "video":
            self.fake.put_video(job.name)
        else:
            self.fake.put_batch(
                job.name, "BATCH_STATE_RUNNING", create_time=rfc3339(now), update_time=rfc3339(now)
            )
        if job.lineage:
            key = f"incoming/{job.name.split('/')[-1]}.jsonl"
            with labelled("harness"):
                self.s3.put_object(Bucket=BUCKET, Key=key, Body=lineage_input(self.rows()))
            body = {"retry": {"maxAttempts": 2, "input": f"s3://{BUCKET}/{key}"}}
        self.api("PUT", job.name, json.dumps(body).encode())
        self.counts[f"submitted_{job.kind}"] += 1
        self.at(now + job.duration_s, "finish", job)

    def rows(self) -> int:
        return max(10, OUTPUT_BYTES // self.sizes.scale // len(answer_line("k00000")))

    def finish(self, job: Job) -> None:
        if job.kind == "video":
            size = VIDEO_BYTES if job.full_size else VIDEO_BYTES // self.sizes.scale
            file_id = "vid-" + job.name.split("/")[-1]
            expires = rfc3339(time.time() + 2 * 86400)
            self.fake.put_file(
                file_id, body=b"\0" * size, mime_type="video/mp4", expiration_time=expires
            )
            uri = f"{self.fake.base_url}/v1beta/files/{file_id}"
            self.fake.put_video(job.name, done=True, video_uri=uri)
        else:
            self.fake.run_batch(job.name, self.output_of(job))
            self.expire_later(job.name)
        self.counts[f"finished_{job.kind}"] += 1
        self.at(time.time() + 2, "webhook", job)
        if self.rng.random() < DUPLICATE_SHARE:
            self.at(time.time() + 62, "webhook", job)

    def expire_later(self, name: str) -> None:
        """Gemini keeps a result file 48 h: give the fake's file that expiration time."""
        body = self.fake.resource(name) or {}
        output = (body.get("metadata") or {}).get("output") or {}
        file_name = output.get("responsesFile")
        resource = self.fake.resource(file_name) if file_name else None
        if resource is not None:
            resource["expirationTime"] = rfc3339(time.time() + 48 * 3600)
            self.fake.put(file_name, resource)

    def output_of(self, job: Job) -> bytes:
        if job.kind == "child":
            keys = [
                json.loads(line)["key"] for line in self.fake.batch_input(job.name).splitlines()
            ]
            return b"".join(answer_line(k) for k in keys)
        if job.full_size:
            rows = OUTPUT_BYTES // len(answer_line("k00000"))
            return b"".join(answer_line(f"k{i:05d}") for i in range(rows))
        rows = self.rows()
        if job.lineage:
            return b"".join(
                failed_line(f"k{i:05d}") if i % 20 == 7 else answer_line(f"k{i:05d}")
                for i in range(rows)
            )
        if "plain" not in self.outputs:
            self.outputs["plain"] = b"".join(answer_line(f"k{i:05d}") for i in range(rows))
        return self.outputs["plain"]

    def webhook(self, job: Job) -> None:
        from tests.support.webhooks import signed_headers, webhook_event

        now = time.time()
        if job.kind == "video":
            file_id = "vid-" + job.name.split("/")[-1]
            data: dict[str, Any] = {
                "id": job.name,
                "output_file_uri": f"files/{file_id}",
                "file_name": file_id,
            }
            kind = "video.generated"
        else:
            body = self.fake.resource(job.name) or {}
            output = (body.get("metadata") or {}).get("output") or {}
            data = {"id": job.name, "output_file_uri": output.get("responsesFile")}
            kind = "batch.succeeded"
        payload = json.dumps(
            {
                "type": kind,
                "version": "v1",
                "timestamp": rfc3339(job.start_s + job.duration_s),
                "data": data,
            },
            separators=(",", ":"),
        ).encode()
        headers = signed_headers(
            payload, secrets=(self.secret,), msg_id=f"msg_{uuid.uuid4().hex}", timestamp=int(now)
        )
        answer = self.invoke("webhook", webhook_event(payload, headers), 10)
        if not self.functions.suffix:
            self.http_requests += P.chunks(len(payload), P.API_GATEWAY_UNIT_BYTES)
        if answer.get("statusCode") != 200:
            self.webhook_errors += 1
        self.counts["webhook_deliveries"] += 1

    def api(self, method: str, name: str, body: bytes) -> None:
        from tests.support.webhooks import operation_event

        answer = self.invoke("webhook", operation_event(method, name, body), 10)
        if not self.functions.suffix:
            self.http_requests += P.chunks(len(body), P.API_GATEWAY_UNIT_BYTES)
        if answer.get("statusCode") != 200:
            raise RuntimeError(f"{method} {name}: {answer.get('statusCode')} {answer.get('body')}")

    def reconcile(self, _: Any) -> None:
        event = {"source": "gemini-opstate.schedule", "detail-type": "Scheduled Reconcile"}
        self.invoke("reconcile", event, 180)
        self.scheduler_invocations += 1


def _archive_settled(record: dict[str, Any]) -> bool:
    """The resumer's ResultsSettled filter: a MODIFY whose new image's archive_status is none
    or expired."""
    if record.get("eventName") != "MODIFY":
        return False
    status = record["dynamodb"].get("NewImage", {}).get("archive_status", {}).get("S")
    return status in ("none", "expired")


def answer_line(key: str) -> bytes:
    """An answered output row of about 1 KB with its usage."""
    row = {
        "key": key,
        "response": {
            "candidates": [
                {
                    "content": {"parts": [{"text": "x" * 900}], "role": "model"},
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 700,
                "candidatesTokenCount": 300,
                "totalTokenCount": 1000,
            },
            "modelVersion": "gemini-2.5-flash",
        },
    }
    return json.dumps(row, separators=(",", ":")).encode() + b"\n"


def failed_line(key: str) -> bytes:
    row = {"key": key, "error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}
    return json.dumps(row, separators=(",", ":")).encode() + b"\n"


def lineage_input(rows: int) -> bytes:
    from tests.support.retry_rows import request_bytes

    return b"".join(request_bytes(f"k{i:05d}") for i in range(rows))


# --- the whole run -----------------------------------------------------------------------------


@dataclass
class Rig:
    server: Any
    fake: Any
    env: dict[str, str]
    memory: dict[str, int]
    facts: dict[str, Any]
    ddb: Any
    s3: Any
    streams: Any
    table: str


@contextlib.contextmanager
def rig(parameters: dict[str, str] | None = None, discover: str | None = None) -> Iterator[Rig]:
    """The moto server, the fake Gemini and the functions' environment as the template gives
    it, deployed with ``DEPLOY_PARAMETERS`` and ``parameters`` (overrides) and, when given,
    ``OPSTATE_DISCOVER=discover``."""
    import boto3

    from tests.support.fake_gemini import FakeGemini
    from tests.support.motoserver import start_moto_server
    from tests.support.template import create_table_from_template
    from tests.support.webhooks import TEST_SECRET

    install_meter()
    server = start_moto_server()
    fake = FakeGemini()
    fake.start()
    saved = dict(os.environ)
    try:
        table, waiters = f"{STACK}-operations", f"{STACK}-waiters"
        refs = {
            "OperationsTable": table,
            "WaitersTable": waiters,
            "EventBus": f"{STACK}-operations",
            "ResultsBucket": BUCKET,
            "ArchiverFunction": f"{STACK}-archiver",
            "WebhookQuarantineQueue": "",
            "AWS::StackName": STACK,
            "AWS::Region": "us-east-1",
            **DEPLOY_PARAMETERS,
            **(parameters or {}),
        }
        env, memory, facts = template_config(refs)
        for key in [k for k in env if k.endswith("_SECRET_ARN")]:
            env.pop(key)
        env.update(
            {
                "AWS_ENDPOINT_URL": server.endpoint,
                "GEMINI_API_KEY": "bench-key",
                "GOOGLE_GEMINI_BASE_URL": fake.base_url,
                "OPSTATE_WEBHOOK_SECRETS": TEST_SECRET,
                "POWERTOOLS_TRACE_DISABLED": "true",
            }
        )
        if discover is not None:
            env["OPSTATE_DISCOVER"] = discover
        env = {k: v for k, v in env.items() if v != ""}
        for key in ("OPSTATE_STORE", "OPSTATE_QUARANTINE_QUEUE_URL"):
            os.environ.pop(key, None)
        os.environ.update(env)
        fake.api_key = "bench-key"
        with labelled("harness"):
            ddb = boto3.client("dynamodb")
            create_table_from_template(ddb, table)
            create_table_from_template(ddb, waiters, "WaitersTable")
            s3 = boto3.client("s3")
            s3.create_bucket(Bucket=BUCKET)
            boto3.client("events").create_event_bus(Name=refs["EventBus"])
            streams = boto3.client("dynamodbstreams")
        yield Rig(server, fake, env, memory, facts, ddb, s3, streams, table)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        # The fake's shutdown can wait long for the SDK's kept-alive connections: let it end
        # on its own (a daemon thread) instead of holding the report.
        threading.Thread(target=fake.stop, daemon=True).start()
        server.stop()


def measure(
    sizes: Sizes = FULL,
    seed: int = 41,
    *,
    parameters: dict[str, str] | None = None,
    discover: str | None = None,
) -> dict[str, Any]:
    """The day, the calibration, the Step Functions poller beside it, priced. ``parameters``:
    template parameter overrides; ``discover``: ``OPSTATE_DISCOVER`` (default: the template's)."""
    import time_machine

    from opstate import api as api_module
    from opstate import config as config_module
    from opstate import observability
    from tests.support.webhooks import TEST_SECRET

    started = time.perf_counter()
    with rig(parameters, discover) as r:
        config_module.settings.cache_clear()
        observability.reset_metric_switch()
        api_module.reset_default_app()
        functions = Functions(r.memory, r.fake)
        day = Day(
            sizes,
            functions,
            r.fake,
            r.s3,
            Stream(r.ddb, r.streams, r.table),
            r.facts["operations_indexes"],
            TEST_SECRET,
            random.Random(seed),
        )
        day.rate_minutes = r.facts["reconcile_rate_minutes"]
        traveller = time_machine.travel(DAY_START_S, tick=True)
        day.traveller = traveller.start()
        try:
            for short in FUNCTIONS.values():
                functions.entry(short)
            day.plan()
            day.run()
            day.day_counts = Counter(day.counts)
            day_seconds = time.perf_counter() - started
            calibration = calibrate(day, sizes)
            stored = stored_bytes(r.s3, sizes.scale)
            poll_ms = poller_time_ms(r.fake)
        finally:
            traveller.stop()
            api_module.reset_default_app()
            config_module.settings.cache_clear()
    poller = step_functions_poller(day, poll_ms)
    result = report(day, sizes, r.facts, calibration, stored, poller)
    result["peers"] = peer_table(day, poll_ms, result)
    result["deployed_with"] = {**DEPLOY_PARAMETERS, **(parameters or {})}
    result["discover"] = (
        discover
        or r.env.get("OPSTATE_DISCOVER")
        or f"{config_module.Settings.from_env({}).reconcile_discover} (the code's default)"
    )
    result["seconds"] = {
        "day": round(day_seconds, 1),
        "total": round(time.perf_counter() - started, 1),
    }
    return result


def calibrate(day: Day, sizes: Sizes) -> dict[str, Any]:
    """Archive ``sizes.calibration`` full 10 MB outputs and as many scaled ones; the difference
    per archive in S3 requests (by operation) and archiver milliseconds."""
    per: dict[str, dict[str, Any]] = {}
    for tag, full in (("full", True), ("scaled", False)):
        day.functions.suffix = f"@{tag}"
        start = time.time() + 60
        for i in range(sizes.calibration):
            job = Job(f"batches/calib-{tag}-{i}", "batch", start + i, 600, full_size=full)
            day.jobs[job.name] = job
            day.at(job.start_s, "submit", job)
        day.queue = [q for q in day.queue if q[2] != "reconcile"]
        heapq.heapify(day.queue)
        while day.queue:
            t, _, kind, payload = heapq.heappop(day.queue)
            day.travel(t)
            {"submit": day.submit, "finish": day.finish, "webhook": day.webhook}[kind](payload)
            day.settle()
        label = f"archiver@{tag}"
        s3 = Counter(
            {op: n for (lab, svc, op), n in METER.calls.items() if lab == label and svc == "s3"}
        )
        ms = sum(i.ms for i in day.functions.invocations if i.label == label)
        per[tag] = {
            "s3": {k: v / sizes.calibration for k, v in s3.items()},
            "ms": ms / sizes.calibration,
        }
    day.functions.suffix = ""
    ops = set(per["full"]["s3"]) | set(per["scaled"]["s3"])
    return {
        "archives": sizes.calibration,
        "full": per["full"],
        "scaled": per["scaled"],
        "delta_s3": {
            op: per["full"]["s3"].get(op, 0) - per["scaled"]["s3"].get(op, 0) for op in sorted(ops)
        },
        "delta_ms": per["full"]["ms"] - per["scaled"]["ms"],
    }


def stored_bytes(s3: Any, scale: int) -> dict[str, int]:
    """Bytes kept in the results bucket by kind, scaled outputs counted at their real size
    (calibration objects left out)."""
    out: Counter[str] = Counter()
    with labelled("harness"):
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        for page in pages:
            for obj in page.get("Contents", []):
                key, size = obj["Key"], obj["Size"]
                if "calib-" in key:
                    continue
                if key.startswith("incoming/"):
                    out["incoming (the user's upload)"] += size
                elif key.endswith((".jsonl", ".mp4")) and "/inputs/" not in key:
                    out["outputs and finals (unscaled)"] += size * scale
                else:
                    out["inputs, summaries, ledgers"] += size
    return dict(out)


def step_functions_poller(day: Day, done: float) -> dict[str, Any]:
    """The same jobs (batches and videos; retries are not part of the pattern) polled by a
    Standard workflow every 30 s: transitions and the poll Lambda (128 MB; its duration is a
    measured GET of the job from the fake, warm, plus the same modelled Gemini latency)."""
    durations = [
        j.duration_s
        for j in day.jobs.values()
        if j.kind in ("batch", "video") and not j.full_size and "calib-" not in j.name
    ]
    sfn = P.poller_day(durations, POLL_PERIOD_S)
    billed_ms = math.ceil(done + GEMINI_LATENCY_MS)
    gb_s = sfn.polls * P.gb_seconds(billed_ms, POLLER_MEMORY_MB)
    costs = {
        "state transitions": P.PRICES["sfn_transitions"].cost(sfn.transitions),
        "poll Lambda requests": P.PRICES["lambda_requests"].cost(sfn.polls),
        "poll Lambda GB-seconds": P.PRICES["lambda_gb_s_x86_64"].cost(gb_s),
    }
    total = sum(costs.values())
    return {
        "jobs": sfn.executions,
        "polls": sfn.polls,
        "state_transitions": sfn.transitions,
        "poll_ms_measured": round(done, 2),
        "poll_billed_ms": billed_ms,
        "poll_memory_mb": POLLER_MEMORY_MB,
        "gb_seconds": round(gb_s, 3),
        "usd": {k: round(v, 6) for k, v in costs.items()},
        "usd_total": round(total, 6),
        "usd_per_1000_jobs": round(P.per_thousand(total, sfn.executions), 5),
    }


def peer_table(day: Day, poll_ms: float, got: dict[str, Any]) -> list[dict[str, Any]]:
    """opstate beside the designs of ``peers.py`` for the same jobs (their durations, the
    day's share of duplicate deliveries), per 1,000 jobs, with their price lines."""
    durations = [
        j.duration_s
        for j in day.jobs.values()
        if j.kind in ("batch", "video") and not j.full_size and "calib-" not in j.name
    ]
    billed = math.ceil(poll_ms + GEMINI_LATENCY_MS)
    rows: list[dict[str, Any]] = [
        {
            "design": "opstate, tracking alone (no archiver, no S3)",
            "usd_per_1000_jobs": got["usd_tracking_only_per_1000_jobs"],
        },
        {
            "design": "opstate, all in (results archived)",
            "usd_per_1000_jobs": got["usd_per_1000_jobs"],
        },
    ]
    for design in peers.compare(durations, billed, 1.0 + DUPLICATE_SHARE):
        rows.append(
            {
                "design": design.name,
                "usd_per_1000_jobs": round(design.per_1000_jobs, 5),
                "usd": {k: round(v, 6) for k, v in design.usd.items()},
                "counted": dict(design.counted),
            }
        )
    return rows


def poller_time_ms(fake: Any, rounds: int = 50) -> float:
    name = "batches/poller-probe"
    fake.put_batch(name, "BATCH_STATE_RUNNING")
    request = urllib.request.Request(
        f"{fake.base_url}/v1beta/{name}", headers={"x-goog-api-key": "bench-key"}
    )
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=10) as answer:
            json.loads(answer.read())
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


# --- pricing -----------------------------------------------------------------------------------


def gemini_latency_ms(inv: Invocation) -> float:
    """The modelled Gemini latency of one invocation (the reconciler's requests are spread
    over its workers)."""
    latency = inv.gemini_requests * GEMINI_LATENCY_MS
    return latency / RECONCILE_WORKERS if inv.function == "reconcile" else latency


def platform_bytes(
    invocations: list[Invocation],
    memory_mb: int,
    init_ms: float,
    settings: lambda_logs.LogSettings,
    function_name: str,
) -> int:
    """The bytes of the lines Lambda itself writes for these invocations of one function
    (``lambda_logs``): one cold start per hour it ran, its first invocation of the hour (as
    ``lambda_init_gb_s`` counts them), with the function's init time."""
    total = 0
    cold_hours: set[int] = set()
    for inv in invocations:
        cold = inv.hour not in cold_hours
        cold_hours.add(inv.hour)
        call = lambda_logs.Invocation(
            inv.ms + gemini_latency_ms(inv), memory_mb, init_ms if cold else None
        )
        total += lambda_logs.size(lambda_logs.invocation_lines(settings, call))
        if cold:
            total += lambda_logs.size(lambda_logs.cold_start_lines(settings, function_name))
    return total


def report(
    day: Day,
    sizes: Sizes,
    facts: dict[str, Any],
    calibration: dict[str, Any],
    stored: dict[str, int],
    poller: dict[str, Any],
) -> dict[str, Any]:
    jobs = day.day_counts["submitted_batch"] + day.day_counts["submitted_video"]
    day_inv = [i for i in day.functions.invocations if "@" not in i.label]
    full_archives = day.day_counts["finished_batch"]
    finals = sum(1 for j in day.jobs.values() if j.lineage)

    lambdas: dict[str, dict[str, Any]] = {}
    for short, memory in day.functions.memory.items():
        mine = [i for i in day_inv if i.function == short]
        billed = 0.0
        for inv in mine:
            billed += math.ceil(inv.ms + gemini_latency_ms(inv))
        if short == "archiver":
            billed += calibration["delta_ms"] * (full_archives + finals)
        modelled = 0.0
        for inv in mine:
            share = max(1.0, FULL_VCPU_MB / memory)
            modelled += math.ceil(
                inv.cpu_ms * share + inv.aws_requests * AWS_LATENCY_MS + gemini_latency_ms(inv)
            )
        app_log_bytes = sum(i.log_bytes for i in mine)
        platform_log_bytes = platform_bytes(
            mine,
            memory,
            day.functions.init_ms.get(short, 0.0),
            facts["logging"][short],
            f"{STACK}-{short}",
        )
        lambdas[short] = {
            "invocations": len(mine),
            "cpu_ms": round(sum(i.cpu_ms for i in mine)),
            "modelled_ms": round(modelled),
            "modelled_gb_s": round(P.gb_seconds(modelled, memory), 3),
            "memory_mb": memory,
            "billed_ms": round(billed),
            "gb_s": round(P.gb_seconds(billed, memory), 3),
            "mean_ms": round(statistics.fmean([i.ms for i in mine]), 1) if mine else 0,
            "gemini_requests": sum(i.gemini_requests for i in mine),
            "log_bytes": app_log_bytes + platform_log_bytes,
            "app_log_bytes": app_log_bytes,
            "platform_log_bytes": platform_log_bytes,
            "init_ms": round(day.functions.init_ms.get(short, 0.0), 1),
            "hours_active": len({i.hour for i in mine}),
        }
    uses = {k: P.LambdaUse(v["invocations"], v["gb_s"]) for k, v in lambdas.items()}
    modelled_gb_s_usd = sum(
        P.PRICES[f"lambda_gb_s_{facts['architecture']}"].cost(v["modelled_gb_s"])
        for v in lambdas.values()
    )
    loudest = day.functions.log_messages.most_common(8)
    lambda_usd = P.lambda_cost(uses, facts["architecture"])
    # One cold start per function per hour it ran (an assumption: Lambda does not say when it
    # recycles an idle environment); the INIT phase is billed like the handler.
    init_gb_s = sum(
        P.gb_seconds(v["init_ms"] * v["hours_active"], v["memory_mb"]) for v in lambdas.values()
    )

    calls = Counter[tuple[str, str]]()
    by_function: dict[str, Counter[str]] = {}
    for (label, service, op), n in METER.calls.items():
        if label != "harness" and "@" not in label:
            calls[(service, op)] += n
            by_function.setdefault(label, Counter())[f"{service} {op}"] += n
    s3_ops = {op: n for (svc, op), n in calls.items() if svc == "s3"}
    for op, delta in calibration["delta_s3"].items():
        s3_ops[op] = s3_ops.get(op, 0) + delta * (full_archives + finals)
    s3_usd = P.s3_request_cost(s3_ops)
    rru = sum(v for k, v in METER.rru.items() if k != "harness" and "@" not in k)
    wru = sum(v for k, v in METER.wru.items() if k != "harness" and "@" not in k)
    gsi = sum(v for k, v in METER.gsi_wru.items() if k != "harness" and "@" not in k)
    events = sum(day.event_entries)
    stored_gb = sum(stored.values()) / 1e9
    log_gb = sum(v["log_bytes"] for v in lambdas.values()) / 1e9
    metrics = distinct_metrics(day.functions.log_lines)

    usd = {
        "Lambda requests": sum(
            P.PRICES["lambda_requests"].cost(u.invocations) for u in uses.values()
        ),
        "Lambda GB-seconds": sum(lambda_usd.values())
        - sum(P.PRICES["lambda_requests"].cost(u.invocations) for u in uses.values()),
        "Lambda init (cold starts)": P.PRICES[f"lambda_gb_s_{facts['architecture']}"].cost(
            init_gb_s
        ),
        "API Gateway HTTP API": P.PRICES["apigw_http"].cost(day.http_requests),
        "DynamoDB reads": P.PRICES["dynamodb_rru"].cost(rru),
        "DynamoDB writes (table)": P.PRICES["dynamodb_wru"].cost(wru),
        "DynamoDB writes (indexes)": P.PRICES["dynamodb_wru"].cost(gsi),
        "DynamoDB Streams (Lambda trigger: free)": 0.0,
        "EventBridge custom events": P.PRICES["eventbridge_events"].cost(events),
        "EventBridge Scheduler": P.PRICES["scheduler_invocations"].cost(day.scheduler_invocations),
        "S3 PUT/COPY/POST/LIST": s3_usd["put"],
        "S3 GET/HEAD": s3_usd["get"],
        "CloudWatch Logs ingested": P.PRICES["logs_ingested_gb"].cost(log_gb),
    }
    total = sum(usd.values())
    tracking = sum(v for k, v in usd.items() if not k.startswith("S3")) - (
        lambda_usd.get("archiver", 0.0) + lambda_usd.get("waiters", 0.0)
    )
    # The same with each function's GB-seconds by the CPU model instead of its wall time (the
    # machine's load stretches wall time; the CPU model does not wait on moto or the fake).
    gb_s_price = P.PRICES[f"lambda_gb_s_{facts['architecture']}"]
    by_cpu = {
        k: gb_s_price.cost(v["modelled_gb_s"]) - gb_s_price.cost(v["gb_s"])
        for k, v in lambdas.items()
    }
    total_cpu = total + sum(by_cpu.values())
    tracking_cpu = tracking + sum(v for k, v in by_cpu.items() if k not in ("archiver", "waiters"))
    # Issue 48's "tracking alone" (its floor: a webhook, a handful of writes, three events):
    # also without what archiving, retries and the waiters cause outside their own Lambda and
    # S3 lines, which issue 41's figure above still counted (``archiving_usd``).
    archiving = archiving_usd(day, lambdas, gb_s_price)
    tracking_core = tracking - sum(archiving.values())
    tracking_core_cpu = tracking_cpu - sum(archiving.values())
    # The reconciler runs on its schedule whatever the number of jobs: its share of the day.
    reconciler_day = (
        lambda_usd.get("reconcile", 0.0)
        + usd["EventBridge Scheduler"]
        + P.PRICES["logs_ingested_gb"].cost(lambdas["reconcile"]["log_bytes"] / 1e9)
    )
    storage_month = P.PRICES["s3_storage"].cost(stored_gb)
    fixed = fixed_costs.fixed_month(facts["template"], facts["parameters"], metrics)
    return {
        "sizes": sizes.__dict__,
        "prices_read": P.PRICES_READ,
        "region": P.REGION,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "jobs": jobs,
        "counts": dict(day.day_counts),
        "retry_children": sum(1 for j in day.jobs.values() if j.kind == "child"),
        "webhook_errors": day.webhook_errors,
        "lambda": lambdas,
        "lambda_init_gb_s": round(init_gb_s, 3),
        "aws_calls": {f"{svc} {op}": n for (svc, op), n in sorted(calls.items())},
        "aws_calls_by_function": {k: dict(sorted(v.items())) for k, v in by_function.items()},
        "s3_requests": {k: round(v, 1) for k, v in sorted(s3_ops.items())},
        "dynamodb": {
            "rru": round(rru, 1),
            "wru_table": round(wru, 1),
            "wru_indexes": round(gsi, 1),
            "stream_records": sum(n for k, n in day.stream_records.items() if "@" not in k),
            "how": "units computed from item sizes (reads from the answers, writes from the "
            "stream's old/new images); a failed conditional write at the checked item's units",
        },
        "eventbridge_entries": events,
        "http_api_requests": day.http_requests,
        "scheduler_invocations": day.scheduler_invocations,
        "calibration": calibration,
        "stored_bytes": stored,
        "log_bytes": int(log_gb * 1e9),
        "platform_log_bytes": sum(v["platform_log_bytes"] for v in lambdas.values()),
        "logging": {k: v.__dict__ for k, v in facts["logging"].items()},
        "custom_metrics": len(metrics),
        "usd": {k: round(v, 6) for k, v in usd.items()},
        "usd_total": round(total, 6),
        "usd_per_1000_jobs": round(P.per_thousand(total, jobs), 5),
        "usd_tracking_only_per_1000_jobs": round(P.per_thousand(tracking, jobs), 5),
        "usd_per_1000_jobs_cpu_model": round(P.per_thousand(total_cpu, jobs), 5),
        "usd_tracking_only_per_1000_jobs_cpu_model": round(P.per_thousand(tracking_cpu, jobs), 5),
        "usd_archiving_outside_its_lines": {k: round(v, 6) for k, v in archiving.items()},
        "usd_tracking_core_per_1000_jobs": round(P.per_thousand(tracking_core, jobs), 5),
        "usd_tracking_core_per_1000_jobs_cpu_model": round(
            P.per_thousand(tracking_core_cpu, jobs), 5
        ),
        "usd_reconciler_per_day": round(reconciler_day, 6),
        "usd_lambda_gb_s_cpu_model": round(modelled_gb_s_usd, 6),
        "log_lines_by_message": [[f, m, n] for (f, m), n in loudest],
        "usd_per_1000_jobs_without_reconciler": round(
            P.per_thousand(total - reconciler_day, jobs), 5
        ),
        "s3_storage_usd_per_month_kept": round(storage_month, 6),
        "s3_storage_usd_per_1000_jobs_month": round(P.per_thousand(storage_month, jobs), 5),
        "fixed_usd_per_month": {k: round(v, 4) for k, v in fixed["usd"].items()},
        "fixed_counts": fixed["counts"],
        "fixed_usd_month_total": round(fixed["usd_total"], 4),
        "custom_metrics_sent": sorted(f"{name}{dict(dims) or ''}" for _, name, dims in metrics),
        "step_functions_poller": poller,
        "prices": {
            k: {"usd": p.usd, "per": p.per, "unit": p.unit, "source": p.source}
            for k, p in P.PRICES.items()
        },
    }


# What archiving and retries announce (opstate.notify.entries); the rest is tracking's.
ARCHIVING_DETAIL_TYPES = frozenset(
    {
        "Operation Results Archived",
        "Operation Results Lost",
        "Operation Retry Submitted",
        "Operation Results Final",
        "Job Part Created",
    }
)
ARCHIVING_LABELS = ("archiver", "waiters")
ARCHIVING_INDEXES = ("archive_queue", "retry_queue")


def archiving_usd(day: Any, lambdas: dict[str, dict[str, Any]], gb_s: P.Price) -> dict[str, float]:
    """What archiving, retries and the waiter resumer cost beyond their own Lambda and S3
    lines: their functions' DynamoDB reads and writes, the archive and retry indexes' entries
    other functions write (a terminal change enters ``archive-index``), the events announcing
    archives and retries, their functions' logs and cold starts. Left out of issue 48's
    "tracking alone" (the issue's floor: one webhook invocation, a handful of writes, three
    events), kept in everything else."""
    day_label = {k for k in METER.wru} | {k for k in METER.rru} | {k for k, _ in METER.gsi_by_index}
    theirs = [k for k in day_label if "@" not in k and k.startswith(ARCHIVING_LABELS)]
    wru = sum(METER.wru[k] for k in theirs)
    rru = sum(METER.rru[k] for k in theirs)
    gsi = sum(
        n
        for (label, index), n in METER.gsi_by_index.items()
        if "@" not in label
        and label != "harness"
        and (label.startswith(ARCHIVING_LABELS) or index in ARCHIVING_INDEXES)
    )
    events = sum(n for kind, n in day.event_types.items() if kind in ARCHIVING_DETAIL_TYPES)
    logs = sum(lambdas.get(k, {}).get("log_bytes", 0) for k in ARCHIVING_LABELS)
    init = sum(
        P.gb_seconds(v["init_ms"] * v["hours_active"], v["memory_mb"])
        for k, v in lambdas.items()
        if k in ARCHIVING_LABELS
    )
    return {
        "DynamoDB reads": P.PRICES["dynamodb_rru"].cost(rru),
        "DynamoDB writes (table)": P.PRICES["dynamodb_wru"].cost(wru),
        "DynamoDB writes (indexes)": P.PRICES["dynamodb_wru"].cost(gsi),
        "EventBridge custom events": P.PRICES["eventbridge_events"].cost(events),
        "CloudWatch Logs ingested": P.PRICES["logs_ingested_gb"].cost(logs / 1e9),
        "Lambda init (cold starts)": gb_s.cost(init),
    }


def distinct_metrics(lines: list[bytes]) -> set[tuple[str, str, tuple[tuple[str, str], ...]]]:
    """Every (namespace, metric, dimensions) the EMF lines published: CloudWatch bills each
    as a custom metric-month."""
    seen: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        for directive in doc.get("_aws", {}).get("CloudWatchMetrics", []):
            for dims in directive.get("Dimensions", []) or [[]]:
                values = tuple((d, str(doc.get(d))) for d in dims)
                for metric in directive.get("Metrics", []):
                    seen.add((directive.get("Namespace", ""), metric.get("Name", ""), values))
    return seen


def table_rows(got: dict[str, Any], row: Callable[[str, Any, Any, Any, str], None]) -> None:
    """run.py's table rows: opstate per 1,000 jobs beside each peer design (issue 48: the
    callback designs are the honest comparison, the 30-s poller the one of issue 41)."""
    if "usd_per_1000_jobs" not in got:
        return
    rows = {r["design"]: r["usd_per_1000_jobs"] for r in got.get("peers", [])}
    tracking = got["usd_tracking_only_per_1000_jobs"]
    for design, usd in rows.items():
        if design.startswith("opstate"):
            continue
        row(
            f"AWS cost per 1,000 jobs, opstate tracking vs {design} ({got['jobs']} jobs/day)",
            f"${tracking:.4f}",
            f"${usd:.4f}",
            round(tracking / usd, 3) if usd else "",
            "",
        )
    row(
        "  opstate all in (results archived), per 1,000 jobs; fixed month",
        f"${got['usd_per_1000_jobs']:.4f}",
        f"${got.get('fixed_usd_month_total', 0.0):.2f}",
        "",
        "",
    )


def print_report(got: dict[str, Any]) -> None:
    say = print
    say(f"opstate on AWS, one simulated day: {got['jobs']} jobs {got['counts']}")
    say(f"  prices of {got['prices_read']} ({got['region']}); machine: {got['machine']}")
    say(f"  seconds: {got['seconds']}; retry children: {got['retry_children']}")
    for name, v in got["lambda"].items():
        say(
            f"  Lambda {name:9} {v['invocations']:6} invocations, {v['memory_mb']} MB, "
            f"mean {v['mean_ms']} ms, {v['gb_s']} GB-s, logs {v['log_bytes']} B "
            f"(Lambda's own lines {v['platform_log_bytes']} B)"
        )
    say("  AWS calls: " + ", ".join(f"{k} {v}" for k, v in got["aws_calls"].items()))
    say(f"  DynamoDB: {got['dynamodb']}")
    say(
        f"  EventBridge entries {got['eventbridge_entries']}, HTTP API requests "
        f"{got['http_api_requests']}, scheduler {got['scheduler_invocations']}"
    )
    say(f"  S3 requests (10 MB structure): {got['s3_requests']}")
    say(f"  stored bytes: {got['stored_bytes']}")
    for k, v in got["usd"].items():
        say(f"    {k:42} {v:12.6f}")
    say(f"    {'total (USD)':42} {got['usd_total']:12.6f}")
    say(
        f"  per 1,000 jobs: ${got['usd_per_1000_jobs']:.4f} (tracking only "
        f"${got['usd_tracking_only_per_1000_jobs']:.4f}); S3 storage "
        f"${got['s3_storage_usd_per_1000_jobs_month']:.4f} per 1,000 jobs per month kept"
    )
    say(
        f"  the reconciler's day (runs on its schedule): ${got['usd_reconciler_per_day']:.4f}; "
        f"the rest per 1,000 jobs: ${got['usd_per_1000_jobs_without_reconciler']:.4f}"
    )
    say(
        f"  Lambda GB-seconds by the CPU model instead of wall time: "
        f"${got['usd_lambda_gb_s_cpu_model']:.6f} "
        f"(measured: ${got['usd']['Lambda GB-seconds']:.6f}); so per 1,000 jobs "
        f"${got['usd_per_1000_jobs_cpu_model']:.4f} (tracking only "
        f"${got['usd_tracking_only_per_1000_jobs_cpu_model']:.4f})"
    )
    say(
        f"  tracking alone without what archiving and retries cause beyond their Lambda and "
        f"S3 (issue 48's measure): ${got['usd_tracking_core_per_1000_jobs_cpu_model']:.4f} per "
        f"1,000 jobs by the CPU model (${got['usd_tracking_core_per_1000_jobs']:.4f} wall); "
        f"left out: {got['usd_archiving_outside_its_lines']}"
    )
    say(f"  most frequent log lines: {got['log_lines_by_message']}")
    say(
        f"  fixed per month: ${got['fixed_usd_month_total']:.2f} {got['fixed_usd_per_month']} "
        f"{got['fixed_counts']}; deployed with {got.get('deployed_with')}, "
        f"discover={got.get('discover')}"
    )
    say(f"  custom metrics sent: {got['custom_metrics_sent']}")
    for row in got.get("peers", []):
        say(f"  per 1,000 jobs: ${row['usd_per_1000_jobs']:.4f}  {row['design']}")
    sfn = got["step_functions_poller"]
    say(
        f"  Step Functions poller: {sfn['polls']} polls, {sfn['state_transitions']} "
        f"transitions, {sfn['usd']}: ${sfn['usd_per_1000_jobs']:.4f} per 1,000 jobs"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batches", type=int)
    parser.add_argument("--videos", type=int)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--discover",
        choices=("all", "tracked"),
        help="OPSTATE_DISCOVER for the reconciler (default: what the template sets, or the code)",
    )
    parser.add_argument(
        "--parameter",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a template parameter override, as sam deploy --parameter-overrides (repeatable)",
    )
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.parameter if "=" in item)
    sizes = QUICK if args.quick else FULL
    if args.batches is not None or args.videos is not None:
        sizes = Sizes(
            **{
                **sizes.__dict__,
                "batches": args.batches or sizes.batches,
                "videos": args.videos if args.videos is not None else sizes.videos,
            }
        )
    got = measure(sizes, parameters=overrides, discover=args.discover)
    if args.json:
        print(json.dumps(got, indent=2))
    else:
        print_report(got)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
