"""What every ``opstate`` command shares: exit codes and errors, output (text, JSON, quiet
library logs), settings and store opening, argument checks."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, NoReturn

from opstate.config import ConfigError, Settings, settings
from opstate.events import OpEvent
from opstate.names import InvalidNameError, canonical_name
from opstate.reducer import Decision
from opstate.store.port import RetryableError
from opstate.times import InvalidTimeError, parse_time

if TYPE_CHECKING:
    from opstate.store.port import Store

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

PROG = "opstate"


class CliError(Exception):
    """An expected failure: one sentence on stderr, no traceback."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class UsageError(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


# --------------------------------------------------------------------------------------------
# Output helpers


def out(text: str = "") -> None:
    _stdout().write(text + "\n")


def err(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def print_json(value: Any) -> None:
    _stdout().write(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


_STDOUT: list[IO[str]] = []


def _stdout() -> IO[str]:
    return _STDOUT[-1] if _STDOUT else sys.stdout


@contextlib.contextmanager
def quiet_library_output() -> Iterator[None]:
    """Keep stdout for the command's own output.

    Powertools logs go to stdout by default and metrics print EMF blobs there; while a command
    runs, logs go to stderr at warning level, metrics are off (``POWERTOOLS_METRICS_DISABLED``
    unless the operator set it) and any other stray print goes to stderr. Restored afterwards
    (``main`` may run in-process).
    """
    from opstate.observability import logger

    metrics_switch = "POWERTOOLS_METRICS_DISABLED"
    set_switch = metrics_switch not in os.environ
    if set_switch:
        os.environ[metrics_switch] = "true"

    handler: Any = getattr(logger, "registered_handler", None)
    has_stream = isinstance(handler, logging.StreamHandler)
    previous = handler.stream if has_stream else None
    level = logger.log_level
    if has_stream:
        handler.stream = sys.stderr  # not setStream: it flushes the old stream
    logger.setLevel("WARNING")
    _STDOUT.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _STDOUT.pop()
        if set_switch:
            os.environ.pop(metrics_switch, None)
        logger.setLevel(level)
        if has_stream:
            handler.stream = previous


def decision_line(decision: Decision) -> str:
    record = decision.record
    state = record.state if record is not None else decision.event.state
    version = record.version if record is not None else 0
    if decision.applied:
        return f"{decision.event.name}: {decision.reason}, now {state} (version {version})"
    return f"{decision.event.name}: dropped ({decision.reason}), stays {state} (version {version})"


# --------------------------------------------------------------------------------------------
# Settings, store and names


def settings_for(args: argparse.Namespace) -> Settings:
    try:
        current = settings()
    except ConfigError as exc:
        raise UsageError(f"configuration error: {exc}") from None
    store = getattr(args, "store", None)
    if store:
        current = dataclasses.replace(current, store_url=store)
    return current


@contextlib.contextmanager
def open_store(config: Settings) -> Iterator[Store]:
    from opstate.store import store_from_url

    try:
        store = store_from_url(config.store_url, config)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except RetryableError as exc:
        raise CliError(f"the store {config.store_url} is unavailable: {exc}") from None
    try:
        yield store
    finally:
        store.close()


def name_arg(raw: str) -> str:
    try:
        return canonical_name(raw)
    except InvalidNameError as exc:
        raise UsageError(str(exc)) from None


def time_arg(raw: str) -> str:
    try:
        parse_time(raw)
    except InvalidTimeError as exc:
        raise UsageError(str(exc)) from None
    return raw


def ingest_event(store: Store, event: OpEvent, config: Settings) -> Decision:
    from opstate.ingest import ingest

    return ingest(store, event, max_attempts=config.ingest_max_attempts)


def require_gemini_key(config: Settings) -> None:
    if not config.gemini_api_key and not config.gemini_api_key_secret_arn:
        raise CliError(
            "no Gemini API key: set GEMINI_API_KEY (or OPSTATE_GEMINI_API_KEY_SECRET_ARN)"
        )


class Parser(argparse.ArgumentParser):
    """Usage errors exit with EXIT_USAGE after the usage line."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")
