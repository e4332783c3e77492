"""``opstate get``, ``list``, ``track`` and ``report``: read and write records."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opstate.cli.common import (
    EXIT_OK,
    CliError,
    UsageError,
    decision_line,
    ingest_event,
    name_arg,
    open_store,
    out,
    print_json,
    settings_for,
    time_arg,
)
from opstate.cli.retry import (
    add_policy_flags,
    check_file,
    input_uri,
    policy_body,
    policy_sentence,
    retry_bound,
)
from opstate.cli.views import print_view
from opstate.domain.events import EventError, from_report
from opstate.domain.names import Kind, parse_name
from opstate.domain.strict_json import InvalidJSONError, dumps, loads
from opstate.domain.times import format_time
from opstate.domain.views import decision_to_json, record_to_json
from opstate.outcomes.results import record_outcome
from opstate.store.port import PollState, RetryingStore, Store

if TYPE_CHECKING:
    from opstate.config import Settings
    from opstate.domain.model import OpRecord
    from opstate.domain.retry import RetryPolicy


def add_parsers(
    sub: Any, *, store: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    p = sub.add_parser("get", parents=[store, as_json], help="show one operation")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=cmd_get)

    p = sub.add_parser("list", parents=[store, as_json], help="list operations")
    p.add_argument("--open", action="store_true", help="only operations not yet finished")
    p.add_argument("--kind", choices=[str(k) for k in Kind], help="only this kind")
    p.add_argument(
        "--lost",
        action="store_true",
        help="only operations the reconciler marked lost (not found for a day; no longer polled)",
    )
    p.add_argument(
        "--overdue",
        action="store_true",
        help="only open operations announced overdue (open longer than their kind's threshold)",
    )
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("track", parents=[store, as_json], help="record NAME as PENDING now")
    p.add_argument("name", metavar="NAME")
    add_policy_flags(p)
    p.add_argument(
        "--input",
        metavar="URI",
        help="the batch's input JSONL (s3://BUCKET/KEY or a local file), kept for its retries",
    )
    p.set_defaults(func=cmd_track)

    p = sub.add_parser("report", parents=[store, as_json], help="report a state of NAME")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "state",
        metavar="STATE",
        help="PENDING, RUNNING, REQUIRES_ACTION, SUCCEEDED, FAILED or CANCELLED",
    )
    p.add_argument("--time", metavar="RFC3339", help="server time of the state (default: now)")
    p.add_argument("--details", metavar="JSON", help="a JSON object merged into the details")
    p.set_defaults(func=cmd_report)


def cmd_get(args: argparse.Namespace) -> int:
    config = settings_for(args)
    from opstate.ingest import find_named

    name = name_arg(args.name)
    parsed = parse_name(args.name)
    with open_store(config, must_exist=True) as store:
        # A video record stored under its full name by an earlier release, and a Cloud job
        # keyed with its location as written, are still found.
        record = find_named(store, parsed)
        results, progress = (
            record_outcome(store, record.name) if record is not None else (None, None)
        )
        retry = (
            store.get_retry(record.name)
            if record is not None and isinstance(store, RetryingStore)
            else None
        )
        final = (
            lineage_final(store, record.name, retry.doc)
            if record is not None and retry is not None and not args.json
            else None
        )
    if record is None:
        raise CliError(f"no record for {name} in {config.store_url}")
    # parent/root/attempt and retry only for a record with a retry state (docs/retry.md)
    view = record_to_json(record, results, progress, retry.doc if retry is not None else None)
    detail = retry.doc.get("unavailableDetail") if retry is not None else None
    if isinstance(detail, str) and isinstance(view.get("retry"), dict):
        # The operator reads the store: what no API view shows (docs/security.md, "Acting").
        view["retry"] = {**view["retry"], "detail": detail}
    if args.json:
        print_json(view)
        return EXIT_OK
    if shown_state(record) != view["state"]:  # the text shows how it ended
        view = {**view, "state": f"{view['state']} ({shown_state(record)})"}
    if final is not None and view.get("root") == record.name:  # a root: its lineage's answer
        view["final"] = final
    print_view(view)
    return EXIT_OK


def lineage_final(store: Store, name: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    """A retry root's final result (``domain.retry.final_view``: rows, errors, where, and once
    written what the lineage cost); before it is written, ``cost so far``: the archived
    batches of the lineage priced as the final result will be (``domain.costs``)."""
    from opstate.domain.costs import final_cost_view, lineage_cost
    from opstate.domain.retry import final_view, lineage_names

    final = final_view(doc)
    if final["status"] != "final":
        names = lineage_names(doc, name)
        get_archive = getattr(store, "get_archive", None)
        archives = {n: get_archive(n) if get_archive else None for n in names}
        final["cost so far"] = final_cost_view(
            lineage_cost(
                names, {n: a.as_dict() if a is not None else None for n, a in archives.items()}
            )
        )
    return final


def _marked(store: Any, *, lost: bool, overdue: bool) -> dict[str, PollState]:
    """Poll states of the open records that are lost / overdue (as asked), by name."""
    iter_marked = getattr(store, "iter_marked", None)
    if iter_marked is None:
        raise CliError("this store keeps no reconciler marks")
    return {
        entry.record.name: entry.poll
        for entry in iter_marked()
        if (not lost or entry.poll.lost) and (not overdue or entry.poll.overdue_ns)
    }


def shown_state(record: OpRecord) -> str:
    """The state as the text views show it: an expired batch as EXPIRED (stored FAILED, its
    details' ``reason`` "expired"; JSON views keep the stored state)."""
    if str(record.state) == "FAILED" and record.details.get("reason") == "expired":
        return "EXPIRED"
    return str(record.state)


def _retry_docs(store: Any, records: list[OpRecord]) -> dict[str, Mapping[str, Any]]:
    """The retry state's doc of each listed record that has one (by name)."""
    if not isinstance(store, RetryingStore):
        return {}
    docs = {}
    for record in records:
        state = store.get_retry(record.name)
        if state is not None and state.created_ns == record.created_ns:
            docs[record.name] = state.doc
    return docs


def _lineage_cells(doc: Mapping[str, Any] | None, name: str) -> tuple[str, str]:
    if doc is None:
        return "-", "-"
    from opstate.domain.retry import lineage_of

    found = lineage_of(doc, name)
    attempt = found["attempt"]
    return ("-" if attempt is None else str(attempt)), found["parent"] or "-"


def _mark_json(poll: PollState) -> dict[str, Any]:
    def when(ns: int) -> str | None:
        return format_time(ns) if ns else None

    return {
        "lost_at": when(poll.lost_ns),
        "not_found_since": when(poll.missing_since_ns),
        "not_found_count": poll.misses,
        "overdue_at": when(poll.overdue_ns),
    }


def cmd_list(args: argparse.Namespace) -> int:
    config = settings_for(args)
    marks: dict[str, PollState] | None = None
    with open_store(config, must_exist=True) as store:
        if args.lost or args.overdue:
            marks = _marked(store, lost=args.lost, overdue=args.overdue)
        records = [
            r
            for r in store.iter_all()
            if (not args.open or not r.terminal)
            and (args.kind is None or r.kind == args.kind)
            and (marks is None or r.name in marks)
        ]
        records.sort(key=lambda r: r.name)
        docs = _retry_docs(store, records)
    if args.json:
        views = [record_to_json(r, retry=docs.get(r.name)) for r in records]
        if marks is None:
            print_json(views)
        else:
            print_json([{**v, **_mark_json(marks[v["name"]])} for v in views])
        return EXIT_OK
    if not records:
        out("no operations")
        return EXIT_OK
    rows: list[tuple[str, ...]] = [
        (
            r.name,
            str(r.kind),
            shown_state(r),
            str(r.version),
            format_time(r.update_time_ns) if r.update_time_ns else "-",
        )
        for r in records
    ]
    header: tuple[str, ...] = ("NAME", "KIND", "STATE", "VERSION", "UPDATED")
    if docs:  # a retry lineage in the list: each record's attempt and parent
        header = (*header, "ATTEMPT", "PARENT")
        rows = [(*row, *_lineage_cells(docs.get(row[0]), row[0])) for row in rows]
    if marks is not None:
        header = (*header, "LOST", "OVERDUE")
        rows = [
            (
                *row,
                format_time(marks[row[0]].lost_ns) if marks[row[0]].lost_ns else "-",
                format_time(marks[row[0]].overdue_ns) if marks[row[0]].overdue_ns else "-",
            )
            for row in rows
        ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        out("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return EXIT_OK


def _report(
    args: argparse.Namespace,
    body: Mapping[str, Any] | None,
    retry: Mapping[str, Any] | None = None,
    rows: int | None = None,
) -> int:
    """Ingest the report ``body``; with ``retry`` (a ``"retry"`` object), keep that policy
    beside the record, checked before anything is written (as ``PUT /operations`` does)."""
    config = settings_for(args)
    name_arg(args.name)  # a usage error for a name that is not one
    try:
        # The raw name: a video name's model is kept (details.model) for polling.
        event = from_report(
            args.name, body, now_ns=time.time_ns(), max_future_skew_s=config.max_future_skew_s
        )
    except EventError as exc:
        raise UsageError(exc.message) from None
    policy = _policy(retry, config) if retry is not None else None
    shown: dict[str, Any] | None = None
    with open_store(config) as store:
        if policy is not None:
            _refuse_child(store, event.name)
        decision = ingest_event(store, event, config)
        if policy is not None and decision.record is not None:
            shown = _attach(store, decision.record, policy)
    bound = retry_bound(policy, rows, config) if policy is not None else 0
    if args.json:
        answer = decision_to_json(decision)
        if policy is not None:
            answer["retry"] = shown
            answer["retryBatchesAtMost"] = bound
        print_json(answer)
    else:
        out(decision_line(decision))
        if shown is not None and policy is not None:
            out(f"retry: {shown['status']}, policy {dumps(shown['policy'], sort_keys=True)}")
            out(policy_sentence(policy, bound))
    return EXIT_OK


def _policy(retry: Mapping[str, Any], config: Settings) -> RetryPolicy:
    from opstate.domain.retry import InvalidRetryError, parse_retry
    from opstate.retry.policy import settings_policy

    try:
        return parse_retry(retry, settings_policy(config))
    except InvalidRetryError as exc:
        raise UsageError(f"nothing written: {exc}") from None


def _refuse_child(store: Store, name: str) -> None:
    from opstate.domain.retry import InvalidRetryError
    from opstate.retry.policy import check_keepable

    try:
        check_keepable(store, name)
    except InvalidRetryError as exc:
        raise UsageError(f"nothing written: {exc}") from None


def _attach(store: Store, record: OpRecord, policy: RetryPolicy) -> dict[str, Any] | None:
    from opstate.retry.authority import VIA_CLI
    from opstate.retry.policy import keep_policy

    assert isinstance(store, RetryingStore)  # _refuse_child checked it
    try:
        return keep_policy(store, record, policy, time.time_ns(), via=VIA_CLI)
    except ValueError as exc:  # it became a retry child since _refuse_child looked
        raise CliError(f"the report was written, the policy not: {exc}") from None


def cmd_track(args: argparse.Namespace) -> int:
    retry = policy_body(args, settings_for(args).retry_max_attempts)
    rows = None
    if args.input is not None:
        retry["input"] = input_uri(args.input, "--input ")
        _policy({"input": retry["input"]}, settings_for(args))  # the URI's form first
        # Checked as submit checks it, before anything is written (a bad line: exit 2).
        rows = check_file(retry["input"], settings_for(args), "nothing written: --input")
    # No flag: plain tracking, no policy (the settings' default never attaches one alone).
    return _report(args, None, retry or None, rows)


def cmd_report(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"state": args.state}
    if args.time is not None:
        body["updateTime"] = time_arg(args.time)
    if args.details is not None:
        try:
            details = loads(args.details)  # the API's rule: no NaN/Infinity
        except InvalidJSONError as exc:
            raise UsageError(f"--details must be a JSON object ({exc.message})") from None
        if not isinstance(details, dict):
            raise UsageError("--details must be a JSON object")
        body["details"] = details
    return _report(args, body)
