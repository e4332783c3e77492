"""What every ``opstate`` command shares: exit codes and errors, output (text, JSON, quiet
library logs), settings and store opening, argument checks."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

from opstate.config import (
    DEFAULT_LOCAL_STORE,
    ConfigError,
    Settings,
    settings,
    sqlite_file,
    store_location,
)
from opstate.domain.model import Decision, OpEvent
from opstate.domain.names import InvalidNameError, canonical_name
from opstate.domain.strict_json import dumps
from opstate.domain.times import InvalidTimeError, parse_time
from opstate.store.port import RetryableError
from opstate.terminal import printable_lines

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
    """A line (or the program's lines) of text on stdout, control characters escaped."""
    _stdout().write(printable_lines(text) + "\n")


def err(text: str) -> None:
    """A line of text on stderr, control characters escaped (``opstate.terminal``)."""
    sys.stderr.write(printable_lines(text) + "\n")
    sys.stderr.flush()


def print_json(value: Any) -> None:
    """One JSON document on stdout: sorted keys, 2-space indent, never NaN (``strict_json``)."""
    _stdout().write(dumps(value, indent=2, sort_keys=True) + "\n")


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
    formatter = handler.formatter if has_stream else None
    level = logger.log_level
    if has_stream:
        handler.stream = sys.stderr  # not setStream: it flushes the old stream
        handler.setFormatter(LogSentence())  # an opstate: line, not a JSON document
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
            handler.setFormatter(formatter)


_RECORD_KEYS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class LogSentence(logging.Formatter):
    """A library's log line as the command's own: ``opstate: MESSAGE: key value; ...`` (the
    fields ``observability.log_fields`` gave, a reserved name's alias undone), e.g. a budget
    stop's ``opstate: retry lineage stopped: name batches/x; why the retry budget stopped
    it: ...``; control characters escaped."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            key.rpartition(".")[2]: value
            for key, value in record.__dict__.items()
            if key not in _RECORD_KEYS
        }
        text = f"{PROG}: {record.getMessage()}"
        if fields:
            text += ": " + "; ".join(f"{key} {value}" for key, value in fields.items())
        if record.exc_info and record.exc_info[1] is not None:
            text += f" ({_first_line(record.exc_info[1])})"
        return printable_lines(text)


@contextlib.contextmanager
def aws_region_fallback() -> Iterator[None]:
    """While a command runs, ``AWS_REGION`` stands in for an unset ``AWS_DEFAULT_REGION``.

    boto3 takes its region from ``AWS_DEFAULT_REGION`` or the profile, not from ``AWS_REGION``
    (botocore/configprovider.py: ``'region': ('region', 'AWS_DEFAULT_REGION', None, None)``),
    while Lambda and the other AWS SDKs set or read ``AWS_REGION``: an operator who set only
    that one gets it here too (above the profile's region, as those SDKs rank it). Restored
    afterwards (``main`` may run in-process)."""
    region = (os.environ.get("AWS_REGION") or "").strip()
    previous = os.environ.get("AWS_DEFAULT_REGION")
    fill = bool(region) and not (previous or "").strip()
    if fill:
        os.environ["AWS_DEFAULT_REGION"] = region
    try:
        yield
    finally:
        if fill and previous is None:
            os.environ.pop("AWS_DEFAULT_REGION", None)
        elif fill and previous is not None:
            os.environ["AWS_DEFAULT_REGION"] = previous


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
def open_store(
    config: Settings, *, must_exist: bool = False, empty_if_missing: bool = False
) -> Iterator[Store]:
    """The store named by ``config.store_url``; every failure to open or use it, here or in the
    command's body, becomes one sentence naming the store (``store_error``). ``must_exist``
    (the commands that only read or act on what is there): a SQLite file that is not there is
    ``no store at ...`` (exit 1), and nothing is created, neither the file nor its folders.
    ``empty_if_missing`` (a periodic pass, ``retry --once``, ``archive --once``): said on
    stderr, and the pass runs on an empty store in memory: nothing to do, nothing created."""
    from opstate.store import store_from_url

    url = config.store_url
    if empty_if_missing and missing_store(url) is not None:
        from opstate.store.memory import MemoryStore

        err(f"{PROG}: {missing_store(url)}; nothing to do")
        yield MemoryStore()
        return
    if must_exist:
        require_store(url)
    try:
        store = store_from_url(url, config)
    except Exception as exc:
        error = store_error(url, exc)
        if error is None:
            raise
        raise error from None
    try:
        yield store
    except CliError:
        raise
    except Exception as exc:
        error = store_error(url, exc, opened=True)
        if error is None:
            raise
        raise error from None
    finally:
        store.close()


def require_store(url: str) -> None:
    """``no store at ...`` when ``url`` names a SQLite file that does not exist (a read must
    not invent an empty store: after a ``cd`` the jobs would seem to vanish)."""
    missing = missing_store(url)
    if missing is not None:
        raise CliError(
            f"{missing}; run this where you ran opstate serve, track or submit, or name the "
            "store with --store or OPSTATE_STORE"
        )


def missing_store(url: str) -> str | None:
    """``no store at ... (chosen by ...): nothing has been tracked there`` when ``url`` names a
    SQLite file that is not there (a dangling link too: never followed); else None."""
    path = sqlite_file(url)
    if path is None or path.exists():
        return None
    return (
        f"no store at {store_location(url)} (chosen by {store_origin(url)}): nothing has been "
        "tracked there"
    )


def _sqlite_path(url: str) -> Path | None:
    prefix = "sqlite:///"
    return Path(url[len(prefix) :]) if url.startswith(prefix) else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def store_error(url: str, exc: BaseException, *, opened: bool = False) -> CliError | None:
    """The sentence for a store that cannot be opened or used, or None when ``exc`` is not
    about the store (``opened``: raised while a command was using it)."""
    path = _sqlite_path(url)
    if path is not None and path.is_dir():
        return CliError(
            f"the SQLite store {path} is a directory: name a file with --store or OPSTATE_STORE"
        )
    if path is not None and isinstance(exc, OSError):
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            return CliError(
                f"cannot create the SQLite store {path}: {blocker} is a file, not a directory; "
                f"name another path with --store or OPSTATE_STORE"
            )
        return CliError(
            f"cannot create the SQLite store {path}: {exc.strerror or _first_line(exc)}; "
            "name another path with --store or OPSTATE_STORE"
        )
    if (
        path is not None
        and isinstance(exc, sqlite3.DatabaseError)
        and not isinstance(exc, sqlite3.OperationalError)
    ):
        return CliError(
            f"{path} is not an SQLite database ({_first_line(exc)}): move it away or name "
            "another file with --store or OPSTATE_STORE"
        )
    aws = _aws_store_error(url, exc)
    if aws is not None:
        return aws
    if isinstance(exc, sqlite3.Error):
        return CliError(f"cannot use the SQLite store {path or url}: {_first_line(exc)}")
    if not opened and isinstance(exc, ValueError):
        return UsageError(f"{exc} (the store URL comes from {store_origin(url)})")
    return None


def _aws_store_error(url: str, exc: BaseException) -> CliError | None:
    """The sentence for a store fault, a missing region or credentials, a refused AWS call;
    each names what chose the store (``store_origin``)."""
    chosen = f"{url} (chosen by {store_origin(url)})"
    first = _first_line(exc)
    if _no_credentials(exc):
        return CliError(
            f"no AWS credentials for the store {chosen}: configure them (AWS_PROFILE, "
            f"AWS_ACCESS_KEY_ID, ...) or name another store with --store or OPSTATE_STORE "
            f"[{first}]"
        )
    if url.startswith("dynamodb://") and _no_table(exc):
        return CliError(
            f"no store at {chosen}: the table does not exist in the region "
            f"{_aws_region() or '(none set)'}; check the name and AWS_DEFAULT_REGION (or "
            f"AWS_REGION, or the profile's region), or name another store with --store "
            f"[{first}]"
        )
    if isinstance(exc, RetryableError):
        return CliError(f"the store {chosen} is unavailable, try again later: {first}")
    if url.startswith("dynamodb://") and (
        type(exc).__name__ == "NoRegionError" or "Invalid endpoint" in str(exc)
    ):
        return UsageError(
            f"no usable AWS region for the store {chosen}: set AWS_DEFAULT_REGION (boto3's "
            "variable; opstate also reads AWS_REGION) or a region in the AWS profile "
            f"(AWS_PROFILE), and check AWS_ENDPOINT_URL_DYNAMODB if you set it [{first}]"
        )
    if type(exc).__module__.startswith(("botocore", "boto3")):
        return CliError(
            f"the store {chosen} refused the call ({first}): check the AWS credentials, the "
            "table and its permissions, or name another store with --store"
        )
    return None


def _no_table(exc: BaseException) -> bool:
    """DynamoDB answered ResourceNotFoundException (raised as is, or wrapped by the store as a
    fault): the table is not there."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code in ("ResourceNotFoundException", "TableNotFoundException"):
                return True
        seen = seen.__cause__ or seen.__context__
    return False


def _aws_region() -> str | None:
    """The region boto3 resolves (environment, profile), for the sentence naming it."""
    try:
        import boto3

        region: str | None = boto3.session.Session().region_name
    except Exception:
        return None
    return region


def _no_credentials(exc: BaseException) -> bool:
    """botocore found no credentials (raised as is, or wrapped by a store as a fault)."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ == "NoCredentialsError":
            return True
        seen = seen.__cause__ or seen.__context__
    return "Unable to locate credentials" in str(exc)


def store_origin(url: str) -> str:
    """What chose the store URL in use, for the error (and serve's line) that names it:
    ``OPSTATE_STORE``, ``OPSTATE_TABLE_NAME``, ``the default`` or ``--store``."""
    store_env = (os.environ.get("OPSTATE_STORE") or "").strip()
    if store_env == url:
        return "OPSTATE_STORE"
    table = (os.environ.get("OPSTATE_TABLE_NAME") or "").strip()
    if not store_env and table and url == f"dynamodb://{table}":
        return "OPSTATE_TABLE_NAME"
    if url == DEFAULT_LOCAL_STORE:
        return "the default"
    return "--store"


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
