"""The metrics switch (issue 48): with ``OPSTATE_DETAILED_METRICS=false`` (the template's
default) only the core metrics - the ones an alarm reads - are sent, and only when they count
something; unset or ``true``, every metric, as before. CloudWatch bills each custom metric sent
in a month, so a metric that is not sent costs nothing."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import redirect_stdout

import pytest

from opstate import observability
from opstate.config import ConfigError, Settings
from opstate.observability import CORE_METRICS, METRICS, count, metric_on, metrics


@pytest.fixture
def switch(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    monkeypatch.delenv("POWERTOOLS_DEV", raising=False)
    observability.reset_metric_switch()
    metrics.clear_metrics()
    yield monkeypatch
    observability.reset_metric_switch()
    metrics.clear_metrics()


def _sent(name: str, value: float = 1, **dimensions: str) -> bool:
    """Whether ``count`` sent the metric: a printed blob (dimensions) or a metric in the set."""
    metrics.clear_metrics()
    out = io.StringIO()
    with redirect_stdout(out):
        count(name, value, **dimensions)
    printed = [json.loads(line) for line in out.getvalue().splitlines() if line]
    return bool(printed) or name in metrics.metric_set


def test_unset_sends_every_metric(switch: pytest.MonkeyPatch) -> None:
    switch.delenv("OPSTATE_DETAILED_METRICS", raising=False)
    assert _sent("Polled", 3)
    assert _sent("WebhookDeliveries", outcome="applied")
    assert _sent("OperationsLost", 0)  # a zero too, as before


def test_off_sends_only_core_metrics_that_count_something(switch: pytest.MonkeyPatch) -> None:
    switch.setenv("OPSTATE_DETAILED_METRICS", "false")
    assert not _sent("Polled", 3)
    assert not _sent("WebhookDeliveries", outcome="applied")
    assert not _sent("EventsApplied", reason="created")
    assert not _sent("OperationsLost", 0)
    assert _sent("OperationsLost", 1)
    assert _sent("SignatureRejected")
    assert not metric_on("OldestOpenAgeSeconds", 3600.0)
    for name in CORE_METRICS:
        assert metric_on(name, 1) and not metric_on(name, 0), name
    for name in set(METRICS) - CORE_METRICS:
        assert not metric_on(name, 1), name


def test_the_switch_is_read_once_until_reset(switch: pytest.MonkeyPatch) -> None:
    switch.setenv("OPSTATE_DETAILED_METRICS", "true")
    assert _sent("Polled", 3)
    switch.setenv("OPSTATE_DETAILED_METRICS", "false")
    assert _sent("Polled", 3)  # the value read first holds for the process
    observability.reset_metric_switch()
    assert not _sent("Polled", 3)


def test_the_settings_read_and_check_the_variable() -> None:
    assert Settings.from_env({}).detailed_metrics is True
    assert Settings.from_env({"OPSTATE_DETAILED_METRICS": "false"}).detailed_metrics is False
    with pytest.raises(ConfigError, match="OPSTATE_DETAILED_METRICS"):
        Settings.from_env({"OPSTATE_DETAILED_METRICS": "sometimes"})


def test_a_value_the_settings_refuse_sends_everything(switch: pytest.MonkeyPatch) -> None:
    # The function stops at its settings anyway; the metrics do not hide that.
    switch.setenv("OPSTATE_DETAILED_METRICS", "sometimes")
    assert _sent("Polled", 3)
