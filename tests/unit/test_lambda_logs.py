"""The lines Lambda itself writes to a function's log group (benchmarks/lambda_logs.py, issue
48): their shapes as AWS documents them, and which are sent for each LogFormat and
SystemLogLevel. Nothing here is timed."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.benchmarks import load_benchmark

L = load_benchmark("lambda_logs")
TEXT = L.LogSettings()  # Lambda's default: Text
TRACED = L.LogSettings(tracing=True)
JSON_INFO = L.LogSettings("JSON", "INFO", "INFO", True)
JSON_WARN = L.LogSettings("JSON", "WARN", "INFO", True)
WARM = L.Invocation(15.74, 512)
COLD = L.Invocation(15.74, 512, init_ms=130.49)

# The REPORT line's fields as AWS's Python logging page shows them (tab-separated), with the
# optional Init Duration and the X-Ray part.
REPORT = re.compile(
    r"REPORT RequestId: [0-9a-f-]{36}\tDuration: \d+\.\d{2} ms\tBilled Duration: \d+ ms\t"
    r"Memory Size: \d+ MB\tMax Memory Used: \d+ MB\t(Init Duration: \d+\.\d{2} ms\t)?"
    r"(\nXRAY TraceId: 1-[0-9a-f]{8}-[0-9a-f]{24}\tSegmentId: [0-9a-f]{16}\tSampled: true\t)?\n"
)


def test_text_format_sends_start_end_and_report_for_every_invocation() -> None:
    start, end, report = L.invocation_lines(TEXT, WARM)
    assert start == f"START RequestId: {L.REQUEST_ID} Version: $LATEST\n"
    assert end == f"END RequestId: {L.REQUEST_ID}\n"
    assert REPORT.fullmatch(report), report
    assert "Duration: 15.74 ms\tBilled Duration: 16 ms\tMemory Size: 512 MB" in report
    assert "Init Duration" not in report and "XRAY" not in report
    # A request id is 36 characters: START is 71 bytes, END 52.
    assert (len(start), len(end)) == (71, 52)
    assert L.size([start, end, report]) == 71 + 52 + len(report)


def test_a_cold_start_adds_init_duration_to_report_and_an_init_start_line() -> None:
    report = L.invocation_lines(TEXT, COLD)[2]
    assert REPORT.fullmatch(report), report
    # The INIT phase is billed with the first invocation (AWS's example: 15.74 + 130.49 -> 147).
    assert "Billed Duration: 147 ms" in report and "Init Duration: 130.49 ms\t" in report
    (init,) = L.cold_start_lines(TEXT, "stack-WebhookFunction")
    assert init.startswith(
        f"INIT_START Runtime Version: {L.RUNTIME_VERSION}\tRuntime Version ARN: "
    )
    assert init.endswith(L.RUNTIME_ARN + "\n")


def test_active_tracing_adds_the_xray_part_to_report() -> None:
    report = L.invocation_lines(TRACED, COLD)[2]
    assert REPORT.fullmatch(report), report
    assert f"\nXRAY TraceId: {L.TRACE_ID}\tSegmentId: {L.SEGMENT_ID}\tSampled: true\t\n" in report
    assert L.size([report]) - L.size(L.invocation_lines(TEXT, COLD)[2:]) == len(
        f"\nXRAY TraceId: {L.TRACE_ID}\tSegmentId: {L.SEGMENT_ID}\tSampled: true\t"
    )


def test_text_format_ignores_the_levels() -> None:
    # Level filtering needs the JSON format: Text sends every line whatever the levels say.
    quiet_text = L.LogSettings("Text", "WARN", "ERROR", True)
    assert L.invocation_lines(quiet_text, COLD) == L.invocation_lines(TRACED, COLD)
    assert L.cold_start_lines(quiet_text, "f") == L.cold_start_lines(TEXT, "f")


def test_json_at_warn_sends_no_platform_line() -> None:
    assert L.invocation_lines(JSON_WARN, COLD) == []
    assert L.cold_start_lines(JSON_WARN, "f") == []


def test_json_at_info_sends_start_and_report_as_json_objects() -> None:
    start, report = (json.loads(line) for line in L.invocation_lines(JSON_INFO, COLD))
    assert (start["type"], report["type"]) == ("platform.start", "platform.report")
    assert start["record"]["requestId"] == report["record"]["requestId"] == L.REQUEST_ID
    assert report["record"]["metrics"] == {
        "durationMs": 15.74,
        "billedDurationMs": 147,
        "memorySizeMB": 512,
        "maxMemoryUsedMB": L.MAX_MEMORY_USED_MB,
        "initDurationMs": 130.49,
    }
    assert report["record"]["status"] == "success"
    assert report["record"]["tracing"]["type"] == "X-Amzn-Trace-Id"
    warm = json.loads(L.invocation_lines(JSON_INFO, WARM)[1])
    assert "initDurationMs" not in warm["record"]["metrics"]
    (init,) = (json.loads(line) for line in L.cold_start_lines(JSON_INFO, "stack-Webhook"))
    assert init["type"] == "platform.initStart"
    assert init["record"]["functionName"] == "stack-Webhook"
    assert all(line.endswith("\n") for line in L.invocation_lines(JSON_INFO, WARM))


def test_settings_come_from_logging_config_and_tracing_with_lambdas_defaults() -> None:
    assert L.settings_of(None, None) == L.LogSettings("Text", "INFO", "INFO", False)
    got = L.settings_of(
        {"LogFormat": "JSON", "SystemLogLevel": "WARN", "ApplicationLogLevel": "DEBUG"}, "Active"
    )
    assert got == L.LogSettings("JSON", "WARN", "DEBUG", True)
    assert L.settings_of({"LogFormat": "JSON"}, "PassThrough") == L.LogSettings("JSON")


def test_the_runtime_is_told_the_format_and_application_level_only_with_json() -> None:
    assert L.runtime_environment(TEXT) == {}
    assert L.runtime_environment(L.LogSettings("JSON", "WARN", "DEBUG")) == {
        "AWS_LAMBDA_LOG_FORMAT": "JSON",
        "AWS_LAMBDA_LOG_LEVEL": "DEBUG",
    }


@pytest.mark.parametrize(
    "kwargs",
    [{"log_format": "text"}, {"system_level": "ERROR"}, {"application_level": "WARNING"}],
)
def test_values_lambda_does_not_take_are_refused(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        L.LogSettings(**kwargs)


def test_json_at_debug_is_not_modelled() -> None:
    debug = L.LogSettings("JSON", "DEBUG")
    with pytest.raises(ValueError, match="not modelled"):
        L.invocation_lines(debug, WARM)
    with pytest.raises(ValueError, match="not modelled"):
        L.cold_start_lines(debug, "f")
