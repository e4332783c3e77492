"""``opstate serve``: parse the options, hand over to ``opstate.local.serve``."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from opstate.cli.common import CliError, UsageError, settings_for, store_error, store_origin


def add_parser(sub: Any, *, store: argparse.ArgumentParser) -> None:
    from opstate.config import DEFAULT_RECONCILE_EVERY_S
    from opstate.local.options import DEFAULT_HOST, DEFAULT_PORT
    from opstate.local.secret_file import DEFAULT_SECRET_FILE

    p = sub.add_parser(
        "serve",
        parents=[store],
        help="serve the API locally",
        description="Serve the API app, the operations page and (with GEMINI_API_KEY) the "
        "reconciler on this machine. The store is --store, else OPSTATE_STORE, else "
        "sqlite:///.opstate/ops.db; unlike the other commands, serve does not use "
        "OPSTATE_TABLE_NAME.",
    )
    p.add_argument("--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST}")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    p.add_argument(
        "--reconcile-every",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help="reconciler period when GEMINI_API_KEY is set "
        f"(default {DEFAULT_RECONCILE_EVERY_S:g})",
    )
    p.add_argument(
        "--secret-file",
        metavar="PATH",
        default=str(DEFAULT_SECRET_FILE),
        help=f"webhook secret file when OPSTATE_WEBHOOK_SECRETS is unset "
        f"(default: {DEFAULT_SECRET_FILE})",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for this Host name (a tunnel that forwards its own name); "
        "loopback names and the host of OPSTATE_PUBLIC_URL are always answered, others get 421",
    )
    p.add_argument("--verbose", action="store_true", help="log requests and decisions")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from opstate.config import checked_api_token, serve_store_url
    from opstate.local.serve import ServeError, ServeOptions, serve

    config = settings_for(args)
    checked_api_token(config.api_token)  # checked here alone: only serve uses it
    # Not OPSTATE_TABLE_NAME: a local server writes a deployed table only when told to.
    config = dataclasses.replace(config, store_url=args.store or serve_store_url())
    options = ServeOptions(
        host=args.host,
        port=args.port,
        store_url=config.store_url,
        reconcile_every_s=(
            config.reconcile_every_s if args.reconcile_every is None else args.reconcile_every
        ),
        secret_file=Path(args.secret_file),
        verbose=args.verbose,
        store_chosen_by=store_origin(config.store_url),
        allow_hosts=tuple(args.allow_host),
    )
    try:
        return serve(options, config)
    except ServeError as exc:
        raise CliError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # the store cannot be opened: one sentence naming it
        error = store_error(config.store_url, exc, opened=True)
        if error is None:
            raise
        raise error from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port between 0 and 65535, got {value}")
    return value
