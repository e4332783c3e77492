"""``opstate wait NAME``: block until an operation is terminal (or its results archived, or the
final result of it and its retries written), then print its record; the exit code says how it
ended (docs/cli.md)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from opstate.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    UsageError,
    err,
    name_arg,
    open_store,
    out,
    print_json,
    settings_for,
)
from opstate.domain.strict_json import dumps
from opstate.domain.views import record_to_json
from opstate.waiters import wiring
from opstate.waiters.model import Failure, Success, When, final_of
from opstate.waiters.port import ARCHIVING_UNAVAILABLE
from opstate.waiters.run import WAIT_POLL_INTERVAL_S, store_status, wait_until

EXIT_TIMEOUT = 124  # as timeout(1)


def add_parser(
    sub: Any, *, store: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "wait",
        parents=[store, as_json],
        help="wait until an operation ends; exit 0 SUCCEEDED, 1 failed/lost/expired, 124 timeout",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--until",
        choices=[str(w) for w in When],
        default=str(When.TERMINAL),
        help="terminal (default): the state is final; archived: its results are archived; "
        "final: the final result of it and its retries is written (archived without retries)",
    )
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float,
        help="give up after SECONDS (exit 124); default: wait as long as it takes",
    )
    p.set_defaults(func=cmd_wait)


def cmd_wait(args: argparse.Namespace) -> int:
    when = When(args.until)
    timeout = args.timeout
    if timeout is not None and (not math.isfinite(timeout) or timeout < 0):
        raise UsageError(f"--timeout must be a number of seconds >= 0, got {timeout:g}")
    if when.reads_results and wiring.RESULTS_JSON is None:
        raise UsageError(f"--until {when}: {ARCHIVING_UNAVAILABLE}")
    config = settings_for(args)
    name = name_arg(args.name)
    with open_store(config) as store:
        read = store_status(store, wiring.results_reader_for(store))
        if read(name, False).record is None:
            err(f"opstate: {name} is not tracked (yet) in {config.store_url}; waiting")
        done = wait_until(read, name, when, timeout_s=timeout, interval_s=WAIT_POLL_INTERVAL_S)
    if done is None:
        err(f"opstate: timed out after {timeout:g} s waiting for {name} ({when})")
        return EXIT_TIMEOUT
    verdict, status = done
    assert status.record is not None
    view = record_to_json(status.record)
    if args.json:
        print_json(view)
    else:
        width = max(len(key) for key in view)
        for key, value in view.items():
            shown = dumps(value, sort_keys=True) if isinstance(value, dict) else value
            out(f"{key:<{width}}  {'-' if shown is None else shown}")
        if status.results is not None:
            out(f"{'results':<{width}}  {dumps(dict(status.results), sort_keys=True)}")
        final = final_of(status.retry) if when is When.FINAL else None
        if final is not None:
            out(f"{'final':<{width}}  {dumps(dict(final), sort_keys=True)}")
    if isinstance(verdict, Success):
        return EXIT_OK
    assert isinstance(verdict, Failure)
    err(f"opstate: {name} ended {verdict.error}")
    return EXIT_FAILURE
