"""``opstate refresh NAME``: poll one operation now, through the reconciler's own poll code."""

from __future__ import annotations

import argparse
from typing import Any

from opstate.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    CliError,
    name_arg,
    open_store,
    out,
    print_json,
    require_gemini_key,
    settings_for,
)


def add_parser(
    sub: Any, *, store: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "refresh",
        parents=[store, as_json],
        help="poll one operation at Gemini now (whether it is due or not)",
    )
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=cmd_refresh)


def cmd_refresh(args: argparse.Namespace) -> int:
    config = settings_for(args)
    name = name_arg(args.name)
    require_gemini_key(config)
    from opstate.domain.names import parse_name
    from opstate.ingest import find_named
    from opstate.store.port import PollingStore
    from opstate.wiring.reconcile import refresh_with

    with open_store(config, must_exist=True) as store:
        parsed = parse_name(args.name)
        # A video record stored under its full name by an earlier release, and a Cloud job
        # keyed with its location as written, are still found.
        record = find_named(store, parsed)
        if record is None:
            raise CliError(
                f"no record for {name} in {config.store_url}: track it first (opstate track {name})"
            )
        if not isinstance(store, PollingStore):  # pragma: no cover - every store of ours is
            raise CliError(f"the store {config.store_url} cannot be polled from")
        refreshed = refresh_with(store, config, record)
    if args.json:
        print_json(refreshed.as_dict())
    else:
        out(refreshed.sentence())
    return EXIT_OK if refreshed.error is None else EXIT_FAILURE
