"""The built functions' logs under the template's ``LoggingConfig`` (issue 48), through the real
runtime interface client: ``LogFormat: JSON`` makes Lambda give the runtime
``AWS_LAMBDA_LOG_FORMAT=JSON`` and ``AWS_LAMBDA_LOG_LEVEL`` (the harness sets them as Lambda
does), awslambdaric then puts the root logger at that level and Powertools takes it over
``POWERTOOLS_LOG_LEVEL``. What the log group must still hold: opstate's own lines at the
operator's ``LogLevel`` and every metric; what it must not: the libraries' lines (httpx's one per
Gemini request; botocore's bodies at DEBUG, with the secrets in them).

The reconciler is the function that talks to Gemini and to Secrets Manager: it is run at
``LogLevel`` DEBUG and WARNING, with the ``AWS_LAMBDA_LOG_LEVEL`` the template maps each to.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import GEMINI_TEST_KEY, STACK_NAME, Stack, StartFunction
from tests.e2e.harness import BuiltTemplate, json_objects, lambda_environment, load_event
from tests.support.fake_gemini import FakeGemini
from tests.support.template import load_template

pytestmark = pytest.mark.e2e


def application_level(log_level: str) -> str:
    """The ``ApplicationLogLevel`` the template gives a ``LogLevel`` (its ``LogLevels`` map)."""
    return str(load_template()["Mappings"]["LogLevels"][log_level]["Application"])


def run_reconcile(start: StartFunction, log_level: str) -> tuple[dict[str, Any], str]:
    with FakeGemini() as fake:
        fake.api_key = GEMINI_TEST_KEY
        fake.put_batch("batches/log-running", "BATCH_STATE_RUNNING")
        fake.put_batch("batches/log-done", "BATCH_STATE_SUCCEEDED")
        fake.put_webhook("wh-log", name="log", state="disabled_due_to_failed_deliveries")
        reconcile = start(
            "ReconcileFunction",
            overrides={
                "GOOGLE_GEMINI_BASE_URL": fake.base_url,
                "POWERTOOLS_LOG_LEVEL": log_level,
                "AWS_LAMBDA_LOG_LEVEL": application_level(log_level),
            },
        )
        reconcile.invoke(load_event("schedule.json"))
        # The second run lists the same jobs again: their events are dropped (logged at DEBUG).
        result = reconcile.invoke(load_event("schedule.json"))
        assert fake.hits("batches") >= 1
    return result, reconcile.log_text()


def assert_only_opstates_lines_and_metrics(log_text: str) -> None:
    """No line below WARNING from the root logger (awslambdaric's JSON lines name their
    ``logger``; aws_xray_sdk warns here, with no X-Ray daemon), none of httpx's; opstate's
    lines name the stack as their service."""
    assert "HTTP Request:" not in log_text
    lines = json_objects(log_text)
    libraries = [line for line in lines if "logger" in line]
    assert [line for line in libraries if line["level"] in ("DEBUG", "INFO")] == []
    assert all(
        line.get("service") == STACK_NAME
        for line in lines
        if "message" in line and "logger" not in line
    )


def test_every_function_logs_json_at_the_level_its_log_level_maps_to(
    built_template: BuiltTemplate, stack: Stack
) -> None:
    functions = [
        logical_id
        for logical_id, resource in built_template.resources.items()
        if resource.get("Type") == "AWS::Serverless::Function"
    ]
    assert len(functions) >= 6, functions  # webhook, reconcile, notify, archiver, submit, resumer
    for function in functions:
        env = lambda_environment(
            built_template, function, refs=stack.refs, aws_endpoint=stack.endpoint
        )
        assert env["AWS_LAMBDA_LOG_FORMAT"] == "JSON", function
        assert env["AWS_LAMBDA_LOG_LEVEL"] == env["POWERTOOLS_LOG_LEVEL"] == "INFO", function
    assert {level: application_level(level) for level in ("DEBUG", "INFO", "WARNING", "ERROR")} == {
        "DEBUG": "DEBUG",
        "INFO": "INFO",
        "WARNING": "INFO",
        "ERROR": "INFO",
    }


def test_at_debug_opstates_debug_lines_come_through_and_no_librarys_do(
    start: StartFunction,
) -> None:
    result, log_text = run_reconcile(start, "DEBUG")
    assert result["errors"] == 0, log_text[-3000:]
    ours = [line for line in json_objects(log_text) if line.get("service") == STACK_NAME]
    assert {"DEBUG", "INFO"} <= {line.get("level") for line in ours}
    assert any(line.get("message") == "event dropped" for line in ours)  # a DEBUG line
    assert_only_opstates_lines_and_metrics(log_text)
    # botocore logs Secrets Manager's answer at DEBUG: the key must never reach the log group.
    assert GEMINI_TEST_KEY not in log_text


def test_at_warning_no_info_line_is_written_and_the_metrics_still_are(
    start: StartFunction,
) -> None:
    result, log_text = run_reconcile(start, "WARNING")
    assert result["errors"] == 0, log_text[-3000:]
    messages = [line for line in json_objects(log_text) if "message" in line]
    assert messages  # the disabled webhook is an ERROR line
    assert {line["level"] for line in messages} <= {"WARNING", "ERROR", "CRITICAL"}, messages
    assert "reconcile run" not in log_text  # its INFO summary
    # EMF lines carry no level: Lambda files them at INFO, which the template never filters.
    assert any("_aws" in line for line in json_objects(log_text))
    assert_only_opstates_lines_and_metrics(log_text)
