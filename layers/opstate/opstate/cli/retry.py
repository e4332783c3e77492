"""``opstate submit FILE --model M`` and ``opstate retry --once`` (docs/retry.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from opstate.cli.common import (
    EXIT_OK,
    CliError,
    UsageError,
    out,
    print_json,
    require_gemini_key,
    settings_for,
    store_error,
)
from opstate.config import ConfigError, Settings


def add_parsers(
    sub: Any, *, store: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "submit",
        parents=[store, as_json],
        help="keep a JSONL input, upload it and create a Gemini batch from it",
    )
    p.add_argument("file", metavar="FILE", help="a local .jsonl file, or s3://BUCKET/KEY")
    p.add_argument("--model", required=True, metavar="MODEL", help="e.g. gemini-2.5-flash")
    p.add_argument("--display-name", default="", metavar="D", help="the batch's display name")
    add_policy_flags(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "retry", parents=[store], help="retry failed rows and write final results (one pass)"
    )
    p.add_argument("--once", action="store_true", help="run one pass and exit (required)")
    p.set_defaults(func=cmd_retry)


def add_policy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--retry-attempts",
        type=int,
        metavar="N",
        help="retries of a request key that failed for a passing reason (0-10)",
    )
    p.add_argument(
        "--resubmit-expired",
        action="store_true",
        default=None,
        help="resubmit the whole batch from the kept input when it ends EXPIRED",
    )
    p.add_argument(
        "--pending-timeout-hours",
        type=float,
        metavar="H",
        help="cancel a batch still PENDING after H hours, then resubmit it",
    )


def policy_body(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as a ``"retry"`` object (only the ones given)."""
    body: dict[str, Any] = {}
    if getattr(args, "retry_attempts", None) is not None:
        body["maxAttempts"] = args.retry_attempts
    if getattr(args, "resubmit_expired", None):
        body["resubmitExpired"] = True
    if getattr(args, "pending_timeout_hours", None) is not None:
        body["pendingTimeoutHours"] = args.pending_timeout_hours
    return body


def input_uri(raw: str, label: str = "") -> str:
    """A URI as given (``s3://...``, ``file:///...``: the policy or the source reader says
    which it takes); a local path as the ``file://`` URI of the file it names (a usage error,
    ``label`` first, when there is none)."""
    if "://" in raw:
        return raw
    path = Path(raw).expanduser()
    if not path.is_file():
        raise UsageError(f"{label}{raw}: no such file")
    return path.resolve().as_uri()


def _fail(config: Settings, exc: Exception) -> CliError:
    error = store_error(config.store_url, exc, opened=True)
    if error is not None:
        return error
    from opstate.gemini.errors import GatewayError

    if isinstance(exc, GatewayError):
        return CliError(f"Gemini: {exc.sentence}")
    raise exc


def cmd_submit(args: argparse.Namespace) -> int:
    config = settings_for(args)
    require_gemini_key(config)
    from opstate.domain.retry import InvalidRetryError, parse_retry
    from opstate.retry.inputs import InputError
    from opstate.retry.policy import settings_policy
    from opstate.retry.wiring import submit_from_settings

    body = policy_body(args)
    try:
        # No flag: the deployment's default as it is (0: off); a flag is the opt-in.
        policy = parse_retry(body, settings_policy(config)) if body else settings_policy(config)
    except InvalidRetryError as exc:
        raise UsageError(str(exc)) from None
    source = input_uri(args.file)
    try:
        done = submit_from_settings(
            config,
            source=source,
            model=args.model,
            policy=policy,
            display_name=args.display_name,
        )
    except (InputError, ConfigError) as exc:
        raise UsageError(f"nothing submitted: {exc}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:
        raise _fail(config, exc) from None
    if args.json:
        print_json(done.as_dict() | {"retry": policy.as_doc()})
    else:
        verb = "submitted" if done.created else "already submitted"
        out(f"{done.name}  {verb}, {done.input.rows} requests, input kept at {done.input.location}")
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    if not args.once:
        raise UsageError("retry runs one pass and needs --once (serve and the archiver repeat it)")
    config = settings_for(args)
    require_gemini_key(config)
    from opstate.retry.wiring import retry_from_settings

    try:
        result = retry_from_settings(config, every=True)
    except (ValueError, ConfigError) as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:
        raise _fail(config, exc) from None
    print_json(result.as_dict())
    return EXIT_OK
