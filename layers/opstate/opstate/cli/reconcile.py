"""``opstate reconcile --once``: one reconciler pass."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import replace
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
from opstate.config import DEFAULT_RECONCILE_BUDGET_S


def add_parser(sub: Any, *, store: argparse.ArgumentParser) -> None:
    p = sub.add_parser("reconcile", parents=[store], help="run one reconciler pass")
    p.add_argument("--once", action="store_true", help="run one pass and exit (required)")
    p.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_RECONCILE_BUDGET_S,
        metavar="SECONDS",
        help=(
            "the most the pass may take, Retry-After pauses included: no request starts that "
            f"could end past it (default {DEFAULT_RECONCILE_BUDGET_S:g})"
        ),
    )
    p.set_defaults(func=cmd_reconcile)


def budget_ms(args: argparse.Namespace, margin_s: float) -> Callable[[], int]:
    """``remaining_ms`` for a pass of ``--budget`` seconds from now (``UsageError`` if unusable)."""
    budget_s = args.budget
    if not math.isfinite(budget_s) or budget_s <= margin_s:
        raise UsageError(
            f"--budget must be a number of seconds above {margin_s:g} (the longest one request "
            f"may take), got {budget_s:g}"
        )
    deadline = time.monotonic() + budget_s

    def remaining_ms() -> int:
        return int((deadline - time.monotonic()) * 1000)

    return remaining_ms


def cmd_reconcile(args: argparse.Namespace) -> int:
    if not args.once:
        raise UsageError(
            "reconcile runs one pass and needs --once (the scheduled Lambda and "
            "`opstate serve` repeat it)"
        )
    config = settings_for(args)
    # No request starts unless it can end (at the HTTP timeout) within the budget.
    margin_s = min(config.reconcile_safety_margin_s, config.reconcile_http_timeout_s)
    config = replace(config, reconcile_safety_margin_s=margin_s)
    remaining_ms = budget_ms(args, margin_s)
    require_gemini_key(config)
    from opstate.reconcile.discovery import discovery_sentence
    from opstate.wiring.reconcile import run_from_settings

    try:
        result = run_from_settings(config, remaining_ms=remaining_ms)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # the store cannot be opened or used: one sentence naming it
        error = store_error(config.store_url, exc, opened=True)
        if error is None:
            raise
        raise error from None
    print_json(result.as_dict())
    local = not config.store_url.startswith("dynamodb://")
    if local and result.discovered and result.first_error is None:
        # a machine that just took in every batch the key lists: say so, and the setting
        err(f"{PROG}: {discovery_sentence(config)}")
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
