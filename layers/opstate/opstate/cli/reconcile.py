"""``opstate reconcile --once``: one reconciler pass."""

from __future__ import annotations

import argparse
from typing import Any

from opstate.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    PROG,
    UsageError,
    err,
    print_json,
    require_gemini_key,
    settings_for,
    store_error,
)


def add_parser(sub: Any, *, store: argparse.ArgumentParser) -> None:
    p = sub.add_parser("reconcile", parents=[store], help="run one reconciler pass")
    p.add_argument("--once", action="store_true", help="run one pass and exit (required)")
    p.set_defaults(func=cmd_reconcile)


def cmd_reconcile(args: argparse.Namespace) -> int:
    if not args.once:
        raise UsageError(
            "reconcile runs one pass and needs --once (the scheduled Lambda and "
            "`opstate serve` repeat it)"
        )
    config = settings_for(args)
    require_gemini_key(config)
    from opstate.reconcile import run_from_settings

    try:
        result = run_from_settings(config)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # the store cannot be opened or used: one sentence naming it
        error = store_error(config.store_url, exc, opened=True)
        if error is None:
            raise
        raise error from None
    print_json(result.as_dict())
    if result.first_error is None:
        return EXIT_OK
    # The reasons are in the JSON log lines too; the first one is said here as a sentence.
    if result.failed:
        err(
            f"{PROG}: error: the pass did no useful work: {result.errors} error(s); "
            f"the first: {result.first_error}"
        )
        return EXIT_FAILURE
    err(f"{PROG}: warning: {result.errors} error(s) in the pass; the first: {result.first_error}")
    return EXIT_OK
