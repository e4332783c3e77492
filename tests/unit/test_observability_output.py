"""The hot path's cheaper logging and metrics write exactly what Powertools' own calls wrote.

- ``count`` with dimensions prints the EMF blob ``single_metric`` prints (same namespace,
  dimensions, metric, unit, value; only the timestamp is the emission's own);
- ``log_fields`` writes a field the stdlib reserves (``name``) as that key, with the same line
  as Powertools' thread-safe appended keys gave, and no key left over for the next line;
- ``log_decision`` builds nothing when its level is off.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from typing import Any

import pytest
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from opstate import observability
from opstate.observability import count, log_fields, logger

CASES = [
    ("WebhookDeliveries", 1, {"outcome": "applied"}),
    ("EventsApplied", 1, {"reason": "created"}),
    ("EventsDropped", 3, {"reason": "stale"}),
    ("WebhookDeliveries", 1, {"outcome": "retry-later"}),
]


def blobs(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.parametrize(("name", "value", "dimensions"), CASES)
def test_count_prints_what_single_metric_prints(
    name: str, value: int, dimensions: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    monkeypatch.delenv("POWERTOOLS_DEV", raising=False)
    ours, theirs = io.StringIO(), io.StringIO()
    before_ms = time.time_ns() // 1_000_000
    with redirect_stdout(ours):
        count(name, value, **dimensions)
        count(name, value, **dimensions)  # the second one comes from the cache
    with (
        redirect_stdout(theirs),
        single_metric(
            name=name,
            unit=MetricUnit.Count,
            value=value,
            namespace=observability.NAMESPACE,
            default_dimensions={"service": observability.SERVICE},
        ) as metric,
    ):
        for key, dim in dimensions.items():
            metric.add_dimension(name=key, value=dim)
    expected = blobs(theirs.getvalue())
    got = blobs(ours.getvalue())
    assert len(got) == 2 and len(expected) == 1
    for blob in got:
        stamp = blob["_aws"].pop("Timestamp")
        assert before_ms <= stamp <= time.time_ns() // 1_000_000
    expected[0]["_aws"].pop("Timestamp")
    assert got == expected * 2
    assert ours.getvalue().splitlines()[0] == ours.getvalue().splitlines()[0].strip()


@pytest.mark.parametrize(
    ("environ", "printed"),
    [
        ({}, True),
        ({"POWERTOOLS_METRICS_DISABLED": "true"}, False),
        ({"POWERTOOLS_METRICS_DISABLED": "false"}, True),
        ({"POWERTOOLS_DEV": "true"}, False),
        ({"POWERTOOLS_DEV": "true", "POWERTOOLS_METRICS_DISABLED": "false"}, True),
        ({"POWERTOOLS_DEV": "false"}, True),
    ],
)
def test_count_honours_powertools_metrics_switches(
    environ: dict[str, str], printed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    monkeypatch.delenv("POWERTOOLS_DEV", raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    out = io.StringIO()
    with redirect_stdout(out):
        count("WebhookDeliveries", outcome="applied")
    assert bool(out.getvalue()) is printed


@pytest.fixture
def lines() -> Iterator[Any]:
    """The Powertools logger's JSON lines at INFO, read from a handler of its own."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logger.registered_formatter)
    std = logging.getLogger(observability.SERVICE)
    std.addHandler(handler)
    level = logger.log_level
    logger.setLevel("INFO")

    def read() -> list[dict[str, Any]]:
        out, _ = stream.getvalue(), stream.truncate(0)
        stream.seek(0)
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    try:
        yield read
    finally:
        logger.setLevel(level)
        std.removeHandler(handler)


def test_a_reserved_field_is_written_as_its_own_key_as_appended_keys_wrote_it(lines: Any) -> None:
    fields = {"name": "batches/ab", "reason": "created", "applied": True, "none": None}
    log_fields(logger.info, "event applied", fields)
    # The previous way: Powertools' thread-safe appended keys around the line.
    logger.thread_safe_append_keys(name=fields["name"])
    try:
        logger.info("event applied", extra={k: v for k, v in fields.items() if k != "name"})
    finally:
        logger.thread_safe_remove_keys(["name"])
    log_fields(logger.info, "next line", {"reason": "x"})
    ours, theirs, after = lines()
    for line in (ours, theirs):
        line.pop("timestamp")
        line.pop("location")
    assert ours == theirs
    assert ours["name"] == "batches/ab" and "none" not in ours
    assert not any(key.startswith("opstate_reserved") for key in ours)
    assert "name" not in after


def test_a_reserved_field_is_written_verbatim(lines: Any) -> None:
    # Powertools %-formats a reserved appended key with the record: "%s" wrote the whole
    # LogRecord into the line. The alias is written as given.
    log_fields(logger.warning, "event dropped", {"name": "batches/a%sb%(msg)s"})
    (line,) = lines()
    assert line["name"] == "batches/a%sb%(msg)s"


def test_log_decision_builds_no_fields_when_its_level_is_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opstate.domain.events import Source
    from opstate.domain.model import Decision, OpEvent, Reason
    from opstate.domain.states import State

    built: list[object] = []
    monkeypatch.setattr(observability, "decision_fields", lambda *a, **k: built.append(a) or {})
    event = OpEvent("batches/off", State.RUNNING, 1, Source.WEBHOOK)
    decision = Decision(True, Reason.CREATED, event, None, None)
    level = logger.log_level
    logger.setLevel("WARNING")
    try:
        observability.log_decision(decision)
        assert built == []
        logger.setLevel("INFO")
        observability.log_decision(decision)
        assert len(built) == 1
    finally:
        logger.setLevel(level)


def _record(msg: object, *args: object, created: float = 1_780_000_000.25, **extra: Any) -> Any:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        exc_info = sys.exc_info() if extra.pop("exc", False) else None
    record = logging.LogRecord(
        observability.SERVICE, logging.INFO, __file__, 42, msg, args, exc_info, func="caller"
    )
    record.created = created
    record.msecs = (created - int(created)) * 1000
    record.__dict__.update(extra)
    return record


FORMATTED = [
    _record("event applied", operation="batches/x", reason="created", applied=True, none=None),
    _record("webhook quarantined", detail="a%sb%(msg)s", operation=None),
    _record('{"a": 1}'),  # a JSON message: Powertools writes it parsed
    _record("  [1, 2]"),
    _record("true"),
    _record("NaN"),
    _record("-"),  # looks like a number, is not one
    _record(""),
    _record("count %d of %s", 3, "x"),
    _record({"dict": "message"}),
    _record("failed", exc=True, error_type="ValueError"),
    _record("late in a second", created=1_780_000_000.999),
    _record("next second", created=1_780_000_001.001),
    _record("back again", created=1_780_000_000.5),
]


def test_the_formatter_writes_powertools_own_lines() -> None:
    """The cheaper formatter's line is byte for byte Powertools' formatter's, with the keys
    the logger appends (service, Lambda context, a %-template of a record attribute) and
    thread-local keys; its per-second timestamp text follows the records' own times."""
    from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

    ours, theirs = observability._Formatter(), LambdaPowertoolsFormatter()
    for formatter in (ours, theirs):
        formatter.append_keys(
            service=observability.SERVICE, cold_start=True, pid="%(process)d", sampling_rate=None
        )
    ours.thread_safe_append_keys(request="r-1", file="%(filename)s")
    try:
        for record in FORMATTED:
            assert ours.format(record) == theirs.format(record)
    finally:
        ours.thread_safe_clear_keys()


def test_the_formatter_refuses_what_powertools_refuses() -> None:
    from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

    for formatter in (observability._Formatter(), LambdaPowertoolsFormatter()):
        formatter.append_keys(process=123)  # a record attribute's key must be a %-template
        with pytest.raises(ValueError, match="reserved log attributes"):
            formatter.format(_record("x"))
