"""``opstate wait NAME``: block until an operation is terminal (or its results archived, or the
final result of it and its retries written), then print its record; the exit code says how it
ended (docs/cli.md)."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from opstate.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    UsageError,
    err,
    name_arg,
    open_store,
    print_json,
    settings_for,
)
from opstate.cli.progress import WaitBar, enabled, watched
from opstate.cli.retry import add_progress_flag
from opstate.cli.views import print_view
from opstate.domain.model import OpRecord
from opstate.domain.strict_json import dumps
from opstate.domain.times import NS_PER_SECOND
from opstate.domain.views import record_to_json
from opstate.outcomes.results import record_outcome
from opstate.store.port import RetryingStore
from opstate.waiters import wiring
from opstate.waiters.model import PENDING, Failure, Status, Success, When, decide, final_of
from opstate.waiters.port import ARCHIVING_UNAVAILABLE
from opstate.waiters.run import WAIT_POLL_INTERVAL_S, store_status, wait_until

EXIT_TIMEOUT = 124  # as timeout(1)
# After this long still waiting, wait says once what would move the record (issue 40).
NOTICE_AFTER_S = 3.0


def add_parser(
    sub: Any, *, store: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "wait",
        parents=[store, as_json],
        help="wait until an operation ends (exit codes: see --help)",
        description="Block until NAME is terminal (or its results archived, or its final "
        "result written), then print its record (--json: the get --json view, with final). "
        "wait only reads the store: something else must poll Gemini (opstate serve, "
        "opstate reconcile --once, or for a retry lineage opstate retry --once). Exit codes: "
        "0 when it ended SUCCEEDED (archived: and its results are kept; final: and every "
        "original request has an answer in the final result); 1 when it ended otherwise "
        "(FAILED, CANCELLED, EXPIRED, LOST, results expired; final: some request has none); "
        "124 on --timeout.",
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
    add_progress_flag(p)
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
    bar = WaitBar(name, enabled(args.no_progress))
    with open_store(config, must_exist=True) as store:
        read = store_status(store, wiring.results_reader_for(store))
        if read(name, False).record is None:
            err(f"opstate: {name} is not tracked (yet) in {config.store_url}; waiting")
        notice = Notice(watched(read, bar), when, store, config.store_url, say=bar.say)
        try:
            done = wait_until(
                notice, name, when, timeout_s=timeout, interval_s=WAIT_POLL_INTERVAL_S
            )
        finally:
            bar.close()
        if done is not None and done[1].record is not None:
            view = full_view(store, done[1].record)
    if done is None:
        err(f"opstate: timed out after {timeout:g} s waiting for {name} ({when})")
        return EXIT_TIMEOUT
    verdict, status = done
    if status.results is not None and "results" not in view:
        view["results"] = dict(status.results)  # what the condition was decided on
    final = view.get("final") if when is When.FINAL else None
    if when is not When.FINAL:
        view.pop("final", None)
    _show(view, as_json=args.json)
    if isinstance(verdict, Success):
        unanswered = _unanswered(final_of(status.retry) if final is not None else None)
        if unanswered:
            err(f"opstate: {name}'s final result has no answer for {unanswered}")
            return EXIT_FAILURE
        return EXIT_OK
    assert isinstance(verdict, Failure)
    err(f"opstate: {name} ended {verdict.error}")
    return EXIT_FAILURE


def _show(view: Mapping[str, Any], *, as_json: bool) -> None:
    if as_json:
        print_json(view)
        return
    details = view.get("details")
    expired = isinstance(details, Mapping) and details.get("reason") == "expired"
    if view.get("state") == "FAILED" and expired:  # as get's text: how it ended
        view = {**view, "state": "FAILED (EXPIRED)"}
    print_view(view)


def _unanswered(final: Mapping[str, Any] | None) -> str | None:
    """ "N of M requests (errors ...)" when a written final result has failed rows."""
    rows = final.get("rows") if final is not None else None
    if final is None or not isinstance(rows, Mapping) or not rows.get("failed"):
        return None
    errors = dumps(final.get("errors") or {}, sort_keys=True)
    return f"{rows.get('failed')} of {rows.get('total')} requests (errors {errors})"


def full_view(store: Any, record: OpRecord) -> dict[str, Any]:
    """``opstate get --json``'s view of ``record`` (its results, progress, lineage and retry),
    with a root's ``final`` (``domain.retry.final_view``) when it has a retry state."""
    retry = store.get_retry(record.name) if isinstance(store, RetryingStore) else None
    results, progress = record_outcome(store, record.name)
    doc = retry.doc if retry is not None else None
    view = record_to_json(record, results, progress, doc)
    if doc is not None and view.get("retry") is not None:
        from opstate.domain.retry import final_view

        view["final"] = final_view(doc)
    return view


class Notice:
    """The status reader ``wait_until`` calls, saying once on stderr, ``NOTICE_AFTER_S``
    after the start while the condition still waits, that ``wait`` moves nothing itself
    (what would move it, and how long the poll or the retry pass has been due: a store
    nothing polls shows it)."""

    def __init__(
        self,
        read: Callable[[str, bool], Status],
        when: When,
        store: Any,
        url: str,
        say: Callable[[str], None] = err,
    ) -> None:
        self.read = read
        self.say = say
        self.when = when
        self.store = store
        self.url = url
        self.start = time.monotonic()
        self.said = False

    def __call__(self, name: str, with_results: bool) -> Status:
        status = self.read(name, with_results)
        if self.said or time.monotonic() - self.start < NOTICE_AFTER_S:
            return status
        if decide(self.when, status) is PENDING:
            self.said = True
            self.say(self.sentence(name, status))
        return status

    def sentence(self, name: str, status: Status) -> str:
        record = status.record
        now = time.time_ns()
        due = ""
        if record is not None and not record.terminal:
            poll = getattr(self.store, "poll_state", lambda _n: None)(name)
            if poll is not None and poll.due_ns and poll.due_ns < now:
                due = f"; its poll has been due for {(now - poll.due_ns) // NS_PER_SECOND} s"
        elif status.retry is not None and status.retry.get("status") == "active":
            since = int(status.retry.get("due_ns") or 0)
            if since and since < now:
                due = f"; its retry pass has been due for {(now - since) // NS_PER_SECOND} s"
        shown = record.state if record is not None else "not tracked"
        return (
            f"opstate: still waiting for {name} ({shown}){due}. wait only reads {self.url}: "
            "it moves when something polls Gemini and archives - opstate serve (with "
            "GEMINI_API_KEY), opstate reconcile --once then opstate archive --once, or for a "
            "retry lineage opstate retry --once"
        )
