"""The ``opstate`` console script: build the parser from the command groups, dispatch, and
turn an error into one sentence on stderr and an exit code."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Sequence

from opstate import __version__
from opstate.cli import (
    quarantine,
    reconcile,
    records,
    refresh,
    replay,
    results,
    retry,
    serve,
    wait,
    webhooks,
)
from opstate.cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    PROG,
    CliError,
    Parser,
    aws_region_fallback,
    err,
    quiet_library_output,
)
from opstate.config import ConfigError
from opstate.store.port import RetryableError


def build_parser() -> argparse.ArgumentParser:
    store = Parser(add_help=False)
    store.add_argument(
        "--store",
        metavar="URL",
        help="dynamodb://TABLE, sqlite:///PATH or memory:// (default: OPSTATE_STORE, else "
        "dynamodb://$OPSTATE_TABLE_NAME, else sqlite:///.opstate/ops.db; serve: OPSTATE_STORE, "
        "else sqlite:///.opstate/ops.db)",
    )
    as_json = Parser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON (see docs/cli.md)")

    parser = Parser(
        prog=PROG,
        description="Monotonic state records for Gemini long-running operations.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    serve.add_parser(sub, store=store)
    records.add_parsers(sub, store=store, as_json=as_json)
    replay.add_parser(sub, store=store, as_json=as_json)
    quarantine.add_parser(sub, store=store, as_json=as_json)
    reconcile.add_parser(sub, store=store)
    refresh.add_parser(sub, store=store, as_json=as_json)
    results.add_parsers(sub, store=store, as_json=as_json)
    retry.add_parsers(sub, store=store, as_json=as_json)
    wait.add_parser(sub, store=store, as_json=as_json)
    webhooks.add_parser(sub, as_json=as_json)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``opstate`` console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    quiet = quiet_library_output() if args.command != "serve" else contextlib.nullcontext()
    try:
        with quiet, aws_region_fallback():
            code: int = args.func(args)
        return code
    except CliError as exc:
        err(f"{PROG}: error: {exc.message}")
        return exc.code
    except ConfigError as exc:
        err(f"{PROG}: error: configuration error: {exc}")
        return EXIT_USAGE
    except RetryableError as exc:
        err(f"{PROG}: error: the store is unavailable, try again later: {exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        err(f"{PROG}: interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_FAILURE
    except Exception as exc:
        if type(exc).__module__.startswith(("botocore", "boto3")):
            err(f"{PROG}: error: an AWS call failed: {exc}")
            return EXIT_FAILURE
        raise
