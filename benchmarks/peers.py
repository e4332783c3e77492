"""What waiting for a Gemini job costs on AWS by the designs a user would otherwise pick, from
AWS's published prices (``aws_prices.PRICES``, each with its source): the pure model beside
``bench_aws_cost.py``'s measured opstate day (issue 48). Counts in, dollars out; no I/O.

The designs, per job (the same jobs as the measured day: their durations decide the pollers):

- **poller** (``poller``): a Standard workflow ``Poll`` (Task: a Lambda that GETs the job) ->
  ``Done?`` (Choice) -> ``Wait(period)`` -> ``Poll`` ... -> Succeed: 3 state transitions a
  poll (``aws_prices.poller_day``) plus the poll Lambda's request and GB-seconds. At 30 s and
  at the reconciler's own 5 minutes.
- **Standard workflow waiting for a callback** (``callback_workflow``): ``Register`` (Task
  ``.waitForTaskToken``: a Lambda that keeps the token under the job's name, one DynamoDB
  write) -> ``Done?`` (Choice) -> Succeed: 3 transitions; the token is handed back by the
  **receiver** of Gemini's webhook (API Gateway HTTP API + a Lambda that reads the token, one
  eventually consistent read, and calls ``SendTaskSuccess``).
- **Lambda durable function waiting on a callback** (``durable_callback``): a step that
  registers the callback id (one DynamoDB write), the callback wait, a step that handles the
  answer: 3 durable operations, 2 invocations (the start and the resume; a wait is not billed
  as compute), and the same receiver (it calls ``SendDurableExecutionCallbackSuccess``).

Left out of every design alike: logs, metrics, alarms (opstate's are measured, the peers' are
whatever their owner adds), free tiers, the Gemini side, and archiving results (opstate's
"tracking alone" figure is the one to compare). Express workflows are not a design here: they
stop at 5 minutes, and a batch job runs for hours.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import aws_prices as P

# The Lambdas of the designs: the smallest memory size, and what one call does besides its
# AWS or Gemini request (bench_aws_cost.py gives the poll Lambda a measured GET plus the same
# modelled Gemini latency as opstate's functions).
PEER_MEMORY_MB = 128
AWS_CALL_MS = 5.0  # one AWS API call from a warm Lambda (bench_aws_cost.AWS_LATENCY_MS)
HANDLER_MS = 2.0  # parsing and the handler's own work, per invocation
CALLBACK_TRANSITIONS = 3  # Register (.waitForTaskToken) -> Done? (Choice) -> Succeed
DURABLE_OPERATIONS = 3  # step (register), callback, step (handle the answer)
DURABLE_INVOCATIONS = 2  # the start and the resume after the callback


@dataclass(frozen=True)
class Design:
    """One design's cost of a set of jobs: the dollars by line, and what was counted."""

    name: str
    jobs: int
    usd: Mapping[str, float]
    counted: Mapping[str, float]

    @property
    def total(self) -> float:
        return sum(self.usd.values())

    @property
    def per_1000_jobs(self) -> float:
        return P.per_thousand(self.total, self.jobs)


def _lambda(invocations: float, billed_ms_each: float, architecture: str) -> dict[str, float]:
    gb_s = invocations * P.gb_seconds(math.ceil(billed_ms_each), PEER_MEMORY_MB)
    return {
        "Lambda requests": P.PRICES["lambda_requests"].cost(invocations),
        "Lambda GB-seconds": P.PRICES[f"lambda_gb_s_{architecture}"].cost(gb_s),
    }


def _add(*parts: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, 0.0) + value
    return out


def receiver(
    jobs: int, deliveries_per_job: float, architecture: str = "x86_64"
) -> dict[str, float]:
    """Gemini's webhook into AWS for the callback designs: one HTTP API request and one Lambda
    invocation per delivery (a duplicate too), one eventually consistent read of the kept token
    (at most 4 KB: half a unit) and one call back to the waiting workflow or function."""
    deliveries = jobs * deliveries_per_job
    return _add(
        {"API Gateway HTTP API": P.PRICES["apigw_http"].cost(deliveries)},
        _lambda(deliveries, HANDLER_MS + 2 * AWS_CALL_MS, architecture),
        {"DynamoDB reads": P.PRICES["dynamodb_rru"].cost(deliveries * 0.5)},
    )


def poller(
    durations_s: Iterable[float], period_s: float, poll_ms: float, architecture: str = "x86_64"
) -> Design:
    """A Standard workflow polling each job every ``period_s`` (``poll_ms``: one poll
    Lambda's billed time, its GET of the job included)."""
    day = P.poller_day(durations_s, period_s)
    usd = _add(
        {"Step Functions transitions": P.PRICES["sfn_transitions"].cost(day.transitions)},
        _lambda(day.polls, poll_ms, architecture),
    )
    counted = {"polls": day.polls, "state transitions": day.transitions}
    return Design(f"Step Functions poller, every {period_s:g} s", day.executions, usd, counted)


def callback_workflow(
    jobs: int, deliveries_per_job: float = 1.0, architecture: str = "x86_64"
) -> Design:
    """A Standard workflow per job waiting on ``.waitForTaskToken``, resumed by the receiver."""
    usd = _add(
        {
            "Step Functions transitions": P.PRICES["sfn_transitions"].cost(
                jobs * CALLBACK_TRANSITIONS
            )
        },
        _lambda(jobs, HANDLER_MS + AWS_CALL_MS, architecture),  # Register: keeps the token
        {"DynamoDB writes": P.PRICES["dynamodb_wru"].cost(jobs)},
        receiver(jobs, deliveries_per_job, architecture),
    )
    counted = {
        "state transitions": jobs * CALLBACK_TRANSITIONS,
        "deliveries": jobs * deliveries_per_job,
    }
    return Design("Standard workflow waiting for a callback + receiver", jobs, usd, counted)


def durable_callback(
    jobs: int, deliveries_per_job: float = 1.0, architecture: str = "x86_64"
) -> Design:
    """A Lambda durable function per job waiting on a callback, resumed by the receiver. Its
    checkpoints (a few hundred bytes a job) are billed per GB written and retained: under
    $0.000001 a job at any per-GB price below $1, so left out."""
    usd = _add(
        {
            "Lambda durable operations": P.PRICES["lambda_durable_operations"].cost(
                jobs * DURABLE_OPERATIONS
            )
        },
        _lambda(jobs * DURABLE_INVOCATIONS, HANDLER_MS + AWS_CALL_MS, architecture),
        {"DynamoDB writes": P.PRICES["dynamodb_wru"].cost(jobs)},
        receiver(jobs, deliveries_per_job, architecture),
    )
    counted = {
        "durable operations": jobs * DURABLE_OPERATIONS,
        "deliveries": jobs * deliveries_per_job,
    }
    return Design("Lambda durable function waiting on a callback + receiver", jobs, usd, counted)


def compare(
    durations_s: list[float],
    poll_ms: float,
    deliveries_per_job: float = 1.0,
    architecture: str = "x86_64",
) -> list[Design]:
    """The four peers of docs/bench.md for the same jobs."""
    jobs = len(durations_s)
    return [
        poller(durations_s, 30.0, poll_ms, architecture),
        poller(durations_s, 300.0, poll_ms, architecture),
        callback_workflow(jobs, deliveries_per_job, architecture),
        durable_callback(jobs, deliveries_per_job, architecture),
    ]
