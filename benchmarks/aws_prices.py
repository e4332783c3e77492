"""Published AWS list prices (us-east-1) and the pure arithmetic that prices counted usage.

Used by ``bench_aws_cost.py`` (issue 41, part 3); tested in tests/unit/test_bench_aws_cost.py.
Nothing here does I/O or measures anything: counts in, dollars out.

Every price is the pay-as-you-go list price of US East (N. Virginia), first tier, free tiers
left out (they are per account, not per workload). Read on ``PRICES_READ`` from the pages named
in ``source`` (stored copies of the AWS pricing pages, through the project's search tool).

DynamoDB units are computed from item sizes (``item_size``: the documented rules), not read
from ``ReturnConsumedCapacity`` (moto answers a fixed 0.5 / 1.0 whatever the size):

- a read: ceil(size / 4 KB) units, half of that when eventually consistent; a Query or Scan
  page: the sum of its items' sizes, rounded up to 4 KB (at least one unit);
- a write: ceil(max(size before, size after) / 1 KB) units, at least 1; a conditional write
  whose condition fails still costs the units of the item it was checked against (at least 1);
- every global secondary index an item enters, leaves or changes in costs index writes
  (``gsi_write_units``): an update that moves the index key is a delete plus a put.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PRICES_READ = "2026-12-06"
REGION = "us-east-1"

LAMBDA = "https://aws.amazon.com/lambda/pricing/"
DYNAMODB = "https://aws.amazon.com/dynamodb/pricing/on-demand/"
EVENTBRIDGE = "https://aws.amazon.com/eventbridge/pricing/"
S3 = "https://aws.amazon.com/s3/pricing/"
API_GATEWAY = "https://aws.amazon.com/api-gateway/pricing/"
STEP_FUNCTIONS = "https://aws.amazon.com/step-functions/pricing/"
CLOUDWATCH = "https://aws.amazon.com/cloudwatch/pricing/"
SECRETS_MANAGER = "https://aws.amazon.com/secrets-manager/pricing/"


@dataclass(frozen=True)
class Price:
    """``usd`` per ``per`` units of ``unit``."""

    usd: float
    per: float
    unit: str
    source: str

    def cost(self, units: float) -> float:
        return units * self.usd / self.per


PRICES: dict[str, Price] = {
    "lambda_requests": Price(0.20, 1e6, "Lambda requests", LAMBDA),
    "lambda_gb_s_x86_64": Price(0.0000166667, 1, "Lambda GB-seconds (x86_64)", LAMBDA),
    "lambda_gb_s_arm64": Price(0.0000133334, 1, "Lambda GB-seconds (arm64)", LAMBDA),
    # Durable functions (re:Invent 2025): each step, wait, callback, ... is a durable operation.
    # Not found on AWS's page in the stored copies; a third-party transcription of it calls
    # $8.00/M an example rate (docs/bench.md, "The prices, checked against AWS's pages").
    "lambda_durable_operations": Price(
        8.00, 1e6, "Lambda durable functions: durable operations", LAMBDA
    ),
    # On-demand throughput after the cut of 1 November 2024 (before: $1.25 and $0.25).
    "dynamodb_wru": Price(0.625, 1e6, "DynamoDB on-demand write request units", DYNAMODB),
    "dynamodb_rru": Price(0.125, 1e6, "DynamoDB on-demand read request units", DYNAMODB),
    # GetRecords made by a Lambda event source mapping are not charged (same page: "GetRecords
    # API calls invoked by AWS Lambda as part of DynamoDB triggers are free").
    "dynamodb_stream_rru": Price(0.02, 1e5, "DynamoDB Streams read request units", DYNAMODB),
    "eventbridge_events": Price(1.00, 1e6, "EventBridge custom events (64 KB chunks)", EVENTBRIDGE),
    "scheduler_invocations": Price(1.00, 1e6, "EventBridge Scheduler invocations", EVENTBRIDGE),
    "s3_put_class": Price(0.005, 1000, "S3 Standard PUT, COPY, POST, LIST requests", S3),
    "s3_get_class": Price(0.0004, 1000, "S3 Standard GET, SELECT and all other requests", S3),
    "s3_storage": Price(0.023, 1, "S3 Standard storage, GB-month (first 50 TB)", S3),
    "apigw_http": Price(1.00, 1e6, "API Gateway HTTP API requests (512 KB units)", API_GATEWAY),
    "sfn_transitions": Price(
        0.025, 1000, "Step Functions Standard state transitions", STEP_FUNCTIONS
    ),
    "logs_ingested_gb": Price(0.50, 1, "CloudWatch Logs ingested, GB", CLOUDWATCH),
    "custom_metrics": Price(0.30, 1, "CloudWatch custom metric-month (first 10,000)", CLOUDWATCH),
    "alarms": Price(0.10, 1, "CloudWatch standard alarm metric-month", CLOUDWATCH),
    "dashboards": Price(3.00, 1, "CloudWatch dashboard-month (after 3 free)", CLOUDWATCH),
    "secrets": Price(0.40, 1, "Secrets Manager secret-month", SECRETS_MANAGER),
}

# S3 request classes (S3 pricing page: "DELETE and CANCEL requests are free"; ListParts and
# the List* calls are LIST requests; every other request is priced as a GET).
S3_PUT_CLASS = frozenset(
    {
        "PutObject",
        "CopyObject",
        "UploadPart",
        "UploadPartCopy",
        "CreateMultipartUpload",
        "CompleteMultipartUpload",
        "ListObjects",
        "ListObjectsV2",
        "ListParts",
        "ListMultipartUploads",
        "ListObjectVersions",
    }
)
S3_FREE = frozenset({"DeleteObject", "DeleteObjects", "AbortMultipartUpload"})
API_GATEWAY_UNIT_BYTES = 512 * 1024
EVENTBRIDGE_CHUNK_BYTES = 64 * 1024
READ_UNIT_BYTES = 4096
WRITE_UNIT_BYTES = 1024


def s3_class(operation: str) -> str:
    """``put``, ``get`` or ``free``: the price class of an S3 API operation."""
    if operation in S3_FREE:
        return "free"
    return "put" if operation in S3_PUT_CLASS else "get"


# --- DynamoDB item sizes and units --------------------------------------------------------------


def _number_size(text: str) -> int:
    """A number's size: about one byte per two significant digits, plus one."""
    digits = text.strip().lstrip("+-").replace(".", "")
    if "e" in digits.lower():  # exponent form: count the mantissa's digits
        digits = digits.lower().split("e", 1)[0]
    digits = digits.strip("0") or "0"
    return math.ceil(len(digits) / 2) + 1


def value_size(value: Mapping[str, Any]) -> int:
    """The size of one attribute value in DynamoDB's wire form (``{"S": ...}``, ...)."""
    ((kind, inner),) = value.items()
    if kind == "S":
        return len(str(inner).encode())
    if kind == "N":
        return _number_size(str(inner))
    if kind == "B":
        return len(inner) if isinstance(inner, bytes | bytearray) else len(str(inner))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(s).encode()) for s in inner)
    if kind == "NS":
        return sum(_number_size(str(n)) for n in inner)
    if kind == "BS":
        return sum(len(b) for b in inner)
    if kind == "M":
        return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in inner.items())
    if kind == "L":
        return 3 + sum(value_size(v) + 1 for v in inner)
    raise ValueError(f"unknown DynamoDB type {kind!r}")


def item_size(item: Mapping[str, Mapping[str, Any]] | None) -> int:
    """The size of an item: each attribute's name (UTF-8 bytes) plus its value."""
    if not item:
        return 0
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def read_units(total_bytes: int, *, consistent: bool) -> float:
    """Read request units of one GetItem, or of one Query/Scan page of ``total_bytes``."""
    units = max(1, math.ceil(total_bytes / READ_UNIT_BYTES))
    return float(units) if consistent else units / 2


def write_units(before_bytes: int, after_bytes: int) -> int:
    """Write request units of one write (at least 1)."""
    return max(1, math.ceil(max(before_bytes, after_bytes) / WRITE_UNIT_BYTES))


def _index_key(
    item: Mapping[str, Mapping[str, Any]] | None, keys: Sequence[str]
) -> tuple[Any, ...] | None:
    if not item or any(k not in item for k in keys):
        return None
    return tuple(repr(item[k]) for k in keys)


def gsi_write_units(
    old: Mapping[str, Mapping[str, Any]] | None,
    new: Mapping[str, Mapping[str, Any]] | None,
    indexes: Iterable[Sequence[str]],
) -> int:
    """Index write units of one item change, for indexes that project ALL attributes:
    entering an index is a put, leaving it a delete, a moved key both, a changed item in place
    one write (each rounded up to 1 KB)."""
    units = 0
    old_size, new_size = item_size(old), item_size(new)
    for keys in indexes:
        before, after = _index_key(old, keys), _index_key(new, keys)
        if before is None and after is None:
            continue
        if before is None:
            units += write_units(0, new_size)
        elif after is None:
            units += write_units(old_size, 0)
        elif before != after:
            units += write_units(old_size, 0) + write_units(0, new_size)
        elif old != new:
            units += write_units(old_size, new_size)
    return units


# --- Step Functions: the job-poller pattern ----------------------------------------------------


@dataclass(frozen=True)
class PollerDay:
    """What a Standard workflow polling each job every ``period_s`` does over the jobs."""

    executions: int
    polls: int
    transitions: int


def poller_polls(duration_s: float, period_s: float) -> int:
    """Polls of one job: at 0, period, 2 x period, ... until the first one at or after the
    job's end sees it done."""
    return math.ceil(max(duration_s, 0.0) / period_s) + 1


def poller_day(durations_s: Iterable[float], period_s: float = 30.0) -> PollerDay:
    """The workflow per job: Poll (Task: a Lambda) -> Done? (Choice) -> Wait(period) -> Poll
    ... -> Succeed. With n polls that is n Task + n Choice + (n - 1) Wait + 1 Succeed = 3n
    state transitions (each executed step is one, per the pricing page)."""
    executions = polls = 0
    for duration in durations_s:
        executions += 1
        polls += poller_polls(duration, period_s)
    return PollerDay(executions, polls, 3 * polls)


# --- pricing counted usage ---------------------------------------------------------------------


@dataclass(frozen=True)
class LambdaUse:
    """One function's invocations and billed GB-seconds."""

    invocations: int
    gb_s: float


def lambda_cost(uses: Mapping[str, LambdaUse], architecture: str = "x86_64") -> dict[str, float]:
    """Dollars per function: requests plus GB-seconds."""
    per_gb_s = PRICES[f"lambda_gb_s_{architecture}"]
    requests = PRICES["lambda_requests"]
    return {
        name: requests.cost(use.invocations) + per_gb_s.cost(use.gb_s) for name, use in uses.items()
    }


def gb_seconds(billed_ms: float, memory_mb: int) -> float:
    """Lambda's GB-seconds: billed milliseconds x memory (1 GB = 1024 MB)."""
    return billed_ms / 1000.0 * memory_mb / 1024.0


def s3_request_cost(requests: Mapping[str, int]) -> dict[str, float]:
    """Dollars per S3 request class from counts per operation."""
    out = {"put": 0.0, "get": 0.0, "free": 0.0}
    for operation, n in requests.items():
        cls = s3_class(operation)
        if cls == "put":
            out["put"] += PRICES["s3_put_class"].cost(n)
        elif cls == "get":
            out["get"] += PRICES["s3_get_class"].cost(n)
    return out


def chunks(size_bytes: int, unit: int) -> int:
    """Metering units of a payload (at least one)."""
    return max(1, math.ceil(size_bytes / unit))


def per_thousand(total_usd: float, jobs: int) -> float:
    """Dollars per 1,000 jobs."""
    return total_usd * 1000.0 / jobs if jobs else math.nan
