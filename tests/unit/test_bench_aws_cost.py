"""The pricing arithmetic of benchmarks/bench_aws_cost.py (issue 41): the price table x counts,
DynamoDB units from item sizes, S3 request classes, the Step Functions poller's transitions.
Nothing here is timed."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from tests.support.benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


P = load_benchmark("aws_prices")


def test_every_price_is_dated_and_sourced_from_an_aws_pricing_page() -> None:
    assert P.PRICES_READ == "2026-12-06" and P.REGION == "us-east-1"
    for key, price in P.PRICES.items():
        assert price.source.startswith("https://aws.amazon.com/"), key
        assert price.usd > 0 and price.per > 0, key
    # The figures the issue names.
    assert P.PRICES["sfn_transitions"].cost(1000) == pytest.approx(0.025)
    assert P.PRICES["lambda_requests"].cost(1_000_000) == pytest.approx(0.20)
    assert P.PRICES["dynamodb_wru"].cost(1_000_000) == pytest.approx(0.625)
    assert P.PRICES["dynamodb_rru"].cost(1_000_000) == pytest.approx(0.125)
    assert P.PRICES["eventbridge_events"].cost(1_000_000) == pytest.approx(1.00)


def test_item_size_follows_the_documented_rules() -> None:
    # name bytes + value: a string is its UTF-8 bytes, a number ~1 byte per 2 digits + 1.
    assert P.item_size({"name": {"S": "abc"}}) == 4 + 3
    assert P.item_size({"n": {"N": "12345"}}) == 1 + 4
    assert P.item_size({"n": {"N": "-0.0100"}}) == 1 + 2  # one significant digit
    assert P.item_size({"é": {"S": "é"}}) == 2 + 2
    assert P.item_size({"b": {"BOOL": True}, "z": {"NULL": True}}) == 2 + 2
    # A map: 3 bytes + per element its name, its value and 1 byte; a list likewise.
    assert P.item_size({"m": {"M": {"a": {"S": "x"}}}}) == 1 + 3 + (1 + 1 + 1)
    assert P.item_size({"l": {"L": [{"S": "xy"}, {"N": "1"}]}}) == 1 + 3 + (2 + 1) + (2 + 1)
    assert P.item_size(None) == 0


def test_read_and_write_units_round_up_per_4kb_and_1kb() -> None:
    assert P.read_units(0, consistent=True) == 1
    assert P.read_units(4096, consistent=True) == 1
    assert P.read_units(4097, consistent=True) == 2
    assert P.read_units(4097, consistent=False) == 1.0
    assert P.read_units(100, consistent=False) == 0.5
    assert P.write_units(0, 0) == 1
    assert P.write_units(1024, 10) == 1
    assert P.write_units(10, 1025) == 2


def test_index_writes_of_an_item_entering_moving_changing_and_leaving() -> None:
    keys = [["shard", "due"]]
    small = {"name": {"S": "a"}}
    indexed = {**small, "shard": {"N": "1"}, "due": {"N": "5"}}
    moved = {**indexed, "due": {"N": "6"}}
    changed = {**indexed, "state": {"S": "RUNNING"}}
    assert P.gsi_write_units(None, small, keys) == 0  # never in the index
    assert P.gsi_write_units(small, indexed, keys) == 1  # enters: a put
    assert P.gsi_write_units(indexed, moved, keys) == 2  # key moved: delete + put
    assert P.gsi_write_units(indexed, changed, keys) == 1  # same key, item changed
    assert P.gsi_write_units(indexed, indexed, keys) == 0  # nothing changed
    assert P.gsi_write_units(indexed, small, keys) == 1  # leaves: a delete
    big = {**indexed, "blob": {"S": "x" * 3000}}
    assert P.gsi_write_units(None, big, keys) == math.ceil(P.item_size(big) / 1024)
    assert P.gsi_write_units(small, indexed, keys * 2) == 2  # one per index


def test_s3_requests_are_priced_by_class() -> None:
    assert P.s3_class("UploadPartCopy") == "put"
    assert P.s3_class("HeadObject") == "get"
    assert P.s3_class("AbortMultipartUpload") == "free"
    cost = P.s3_request_cost({"PutObject": 600, "UploadPart": 400, "GetObject": 1000})
    assert cost["put"] == pytest.approx(0.005)
    assert cost["get"] == pytest.approx(0.0004)
    assert P.s3_request_cost({"DeleteObject": 10**6}) == {"put": 0.0, "get": 0.0, "free": 0.0}


def test_lambda_cost_is_requests_plus_gb_seconds() -> None:
    assert P.gb_seconds(1000, 1024) == 1.0
    assert P.gb_seconds(500, 1769) == pytest.approx(0.5 * 1769 / 1024)
    cost = P.lambda_cost(
        {"a": P.LambdaUse(1_000_000, 0.0), "b": P.LambdaUse(0, 1_000_000.0)}, "x86_64"
    )
    assert cost["a"] == pytest.approx(0.20)
    assert cost["b"] == pytest.approx(16.6667)
    arm = P.lambda_cost({"b": P.LambdaUse(0, 1_000_000.0)}, "arm64")
    assert arm["b"] == pytest.approx(13.3334)


def test_step_functions_poller_transitions() -> None:
    # Polls at 0, 30, 60 ... until one at or after the end.
    assert P.poller_polls(0, 30) == 1
    assert P.poller_polls(30, 30) == 2
    assert P.poller_polls(31, 30) == 3
    day = P.poller_day([0, 45, 3600], 30)
    assert (day.executions, day.polls) == (3, 1 + 3 + 121)
    # Task + Choice per poll, a Wait between polls, one Succeed: 3 per poll.
    assert day.transitions == 3 * day.polls
    assert P.PRICES["sfn_transitions"].cost(day.transitions) == pytest.approx(375 * 0.025 / 1000)


def test_metering_units_and_per_thousand() -> None:
    assert P.chunks(0, P.EVENTBRIDGE_CHUNK_BYTES) == 1
    assert P.chunks(64 * 1024 + 1, P.EVENTBRIDGE_CHUNK_BYTES) == 2
    assert P.chunks(512 * 1024, P.API_GATEWAY_UNIT_BYTES) == 1
    assert P.per_thousand(2.5, 500) == 5.0
    assert math.isnan(P.per_thousand(1.0, 0))


# --- issue 48: the peers and the fixed month -----------------------------------------------------

sys.path.insert(0, str(ROOT / "benchmarks"))
import fixed_costs  # noqa: E402
import peers  # noqa: E402

from opstate.observability import CORE_METRICS, METRICS  # noqa: E402
from tests.support.template import load_template  # noqa: E402


def test_durable_operations_are_priced_from_the_lambda_page() -> None:
    price = P.PRICES["lambda_durable_operations"]
    assert price.source == P.LAMBDA and price.cost(1_000_000) == pytest.approx(8.00)


def test_a_callback_workflow_is_three_transitions_a_job_plus_its_receiver() -> None:
    design = peers.callback_workflow(1000, deliveries_per_job=1.0)
    usd = design.usd
    # Register (.waitForTaskToken) -> Done? -> Succeed: the "about $0.075 per 1,000".
    assert usd["Step Functions transitions"] == pytest.approx(0.075)
    # The receiver: 1,000 HTTP API requests, 1,000 Lambda invocations (and the Register
    # Lambda's 1,000), half a read unit each, one write unit per kept token.
    assert usd["API Gateway HTTP API"] == pytest.approx(0.001)
    assert usd["Lambda requests"] == pytest.approx(2 * 0.0002)
    assert usd["DynamoDB reads"] == pytest.approx(500 * 0.125 / 1e6)
    assert usd["DynamoDB writes"] == pytest.approx(1000 * 0.625 / 1e6)
    gb_s = 1000 * P.gb_seconds(12, 128) + 1000 * P.gb_seconds(7, 128)
    assert usd["Lambda GB-seconds"] == pytest.approx(gb_s * 0.0000166667)
    assert 0.075 < design.per_1000_jobs < 0.080


def test_a_durable_function_is_three_operations_a_job_plus_its_receiver() -> None:
    design = peers.durable_callback(1000, deliveries_per_job=1.0)
    assert design.usd["Lambda durable operations"] == pytest.approx(3000 * 8.00 / 1e6)
    assert design.usd["Lambda requests"] == pytest.approx((2000 + 1000) * 0.20 / 1e6)
    assert "Step Functions transitions" not in design.usd
    # The "about $0.03".
    assert 0.024 < design.per_1000_jobs < 0.030
    # A duplicate delivery costs the receiver again, not the waiting function.
    twice = peers.durable_callback(1000, deliveries_per_job=2.0)
    assert twice.usd["Lambda durable operations"] == design.usd["Lambda durable operations"]
    assert twice.usd["API Gateway HTTP API"] == pytest.approx(
        2 * design.usd["API Gateway HTTP API"]
    )


def test_the_poller_at_five_minutes_costs_a_tenth_of_the_one_at_30_seconds() -> None:
    durations = [1800.0] * 100  # 30-minute jobs
    every_30 = peers.poller(durations, 30.0, poll_ms=51)
    every_300 = peers.poller(durations, 300.0, poll_ms=51)
    assert every_30.counted["polls"] == 100 * 61
    assert every_300.counted["polls"] == 100 * 7
    assert every_30.counted["state transitions"] == 3 * 100 * 61
    assert every_30.usd["Step Functions transitions"] == pytest.approx(3 * 6100 * 0.025 / 1000)
    assert every_300.per_1000_jobs < every_30.per_1000_jobs / 8
    names = [d.name for d in peers.compare(durations, 51)]
    assert names == [
        "Step Functions poller, every 30 s",
        "Step Functions poller, every 300 s",
        "Standard workflow waiting for a callback + receiver",
        "Lambda durable function waiting on a callback + receiver",
    ]


def test_an_alarm_is_billed_per_metric_it_reads() -> None:
    plain = {"Properties": {"MetricName": "Errors", "Namespace": "AWS/Lambda"}}
    math_alarm = {
        "Properties": {
            "Metrics": [
                {"Id": "a", "MetricStat": {"Metric": {"MetricName": "5xx"}}},
                {"Id": "b", "MetricStat": {"Metric": {"MetricName": "Count"}}},
                {"Id": "rate", "Expression": "100 * a / b"},
            ]
        }
    }
    assert fixed_costs.alarm_metrics(plain) == 1
    assert fixed_costs.alarm_metrics(math_alarm) == 2


def test_conditions_follow_the_parameters() -> None:
    template = {
        "Parameters": {"On": {"Default": "false"}, "Arns": {"Default": ""}},
        "Conditions": {
            "IsOn": {"Fn::Equals": [{"Ref": "On"}, "true"]},
            "HasArns": {"Fn::Not": [{"Fn::Equals": [{"Fn::Join": ["", {"Ref": "Arns"}]}, ""]}]},
            "Either": {"Fn::Or": [{"Fn::Condition": "IsOn"}, {"Condition": "HasArns"}]},
        },
        "Resources": {
            "A": {"Type": "AWS::CloudWatch::Alarm", "Condition": "Either", "Properties": {}},
            "B": {"Type": "AWS::CloudWatch::Alarm", "Properties": {}},
        },
    }
    kind = "AWS::CloudWatch::Alarm"
    assert set(fixed_costs.deployed(template, {}, kind)) == {"B"}
    assert set(fixed_costs.deployed(template, {"On": "true"}, kind)) == {"A", "B"}
    assert set(fixed_costs.deployed(template, {"Arns": "arn:x,arn:y"}, kind)) == {"A", "B"}
    with pytest.raises(fixed_costs.UnsupportedCondition):
        fixed_costs.condition("X", {"Conditions": {"X": {"Fn::Contains": []}}}, {})


def test_the_default_stack_costs_at_most_3_dollars_a_month_before_any_job() -> None:
    template = load_template()
    default = fixed_costs.fixed_month(template, {}, [])
    # Counted from the template (issue 48): 15 alarms, one a metric-math alarm over two
    # metrics; no dashboard; 3 secrets.
    assert default["counts"] == {
        "custom metrics": 0,
        "alarms": 15,
        "alarm metrics": 16,
        "dashboards": 0,
        "secrets": 3,
    }
    assert default["usd_total"] == pytest.approx(1.60 + 1.20)
    assert default["usd_total"] <= 3.00
    detailed = fixed_costs.fixed_month(template, {"DetailedMetrics": "true"}, [])
    assert detailed["counts"]["dashboards"] == 1
    assert detailed["counts"]["alarms"] == 19
    waiters = fixed_costs.fixed_month(template, {"WaiterStateMachineArns": "arn:aws:states:x"}, [])
    assert waiters["counts"]["alarms"] == 16


def test_the_core_metrics_are_the_ones_the_default_alarms_read() -> None:
    template = load_template()
    namespace = {"Fn::FindInMap": ["Observability", "Metrics", "Namespace"]}
    read: set[str] = set()
    for alarm in fixed_costs.deployed(template, {}, "AWS::CloudWatch::Alarm").values():
        props = alarm["Properties"]
        stats = [props] + [
            m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m
        ]
        read |= {s["MetricName"] for s in stats if s.get("Namespace") == namespace}
    assert read == CORE_METRICS
    assert set(METRICS) >= CORE_METRICS
