"""The pricing arithmetic of benchmarks/bench_aws_cost.py (issue 41): the price table x counts,
DynamoDB units from item sizes, S3 request classes, the Step Functions poller's transitions.
Nothing here is timed."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_aws_prices", ROOT / "benchmarks" / "aws_prices.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


P = _load()


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
