"""opstate's logging under Lambda's log levels (opstate.lambda_logging, issue 48): with the JSON
log format Lambda's runtime puts the root logger at the application level and Powertools takes
that level over POWERTOOLS_LOG_LEVEL; ``settle`` keeps the operator's LogLevel deciding and the
libraries' INFO and DEBUG lines out of the log group."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import pytest
from aws_lambda_powertools import Logger

from opstate.lambda_logging import level_of, settle

_names = itertools.count()


@pytest.fixture(autouse=True)
def _root_level() -> Iterator[None]:
    root = logging.getLogger()
    before = root.level
    yield
    root.setLevel(before)


def powertools_logger(
    monkeypatch: pytest.MonkeyPatch, lambda_level: str | None, ours: str
) -> Logger:
    """A fresh Powertools logger made as Lambda's runtime would see it."""
    if lambda_level is None:
        monkeypatch.delenv("AWS_LAMBDA_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("AWS_LAMBDA_LOG_LEVEL", lambda_level)
    monkeypatch.setenv("POWERTOOLS_LOG_LEVEL", ours)
    return Logger(service=f"test-lambda-logging-{next(_names)}")


@pytest.mark.filterwarnings("ignore:Current log level")  # Powertools' own, on the last case
@pytest.mark.parametrize(
    ("lambda_level", "ours", "expected"),
    [
        ("INFO", "WARNING", logging.WARNING),  # LogLevel=WARNING: INFO lines stay out
        ("INFO", "ERROR", logging.ERROR),
        ("INFO", "INFO", logging.INFO),
        ("DEBUG", "DEBUG", logging.DEBUG),  # LogLevel=DEBUG: the operator's DEBUG comes through
        ("ERROR", "DEBUG", logging.ERROR),  # never below Lambda's: it would drop those lines
    ],
)
def test_the_stricter_of_lambdas_level_and_log_level_decides(
    monkeypatch: pytest.MonkeyPatch, lambda_level: str, ours: str, expected: int
) -> None:
    logger = powertools_logger(monkeypatch, lambda_level, ours)
    # Powertools itself takes Lambda's level first.
    assert logger.log_level == level_of(lambda_level)
    settle(logging.getLogger(logger.name))
    assert logger.log_level == expected


def test_the_root_logger_goes_back_to_warning_under_lambdas_levels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logging.getLogger().setLevel(logging.DEBUG)  # what the runtime does at LogLevel=DEBUG
    logger = powertools_logger(monkeypatch, "DEBUG", "DEBUG")
    settle(logging.getLogger(logger.name))
    assert logging.getLogger().level == logging.WARNING
    # The libraries' lines (httpx: one per Gemini request; botocore: bodies at DEBUG) stay out.
    for library in ("httpx", "botocore.credentials", "botocore.parsers"):
        assert not logging.getLogger(library).isEnabledFor(logging.INFO), library
    assert logging.getLogger(library).isEnabledFor(logging.WARNING)
    assert logger.log_level == logging.DEBUG  # opstate's own DEBUG lines still come through


def test_without_lambdas_levels_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    logging.getLogger().setLevel(logging.INFO)
    logger = powertools_logger(monkeypatch, None, "WARNING")
    settle(logging.getLogger(logger.name))
    assert logging.getLogger().level == logging.INFO
    assert logger.log_level == logging.WARNING


def test_level_names_of_lambda_and_python() -> None:
    assert [level_of(n) for n in ("TRACE", "warn", "WARNING", "FATAL", " info ")] == [
        logging.DEBUG,
        logging.WARNING,
        logging.WARNING,
        logging.CRITICAL,
        logging.INFO,
    ]
    assert level_of(None) is None and level_of("") is None and level_of("LOUD") is None
