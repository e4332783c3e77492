"""``opstate submit FILE --model M`` and ``opstate retry --once`` (docs/retry.md)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opstate.cli.common import (
    EXIT_OK,
    CliError,
    UsageError,
    err,
    name_arg,
    open_store,
    out,
    print_json,
    require_gemini_key,
    settings_for,
    store_error,
)
from opstate.cli.progress import ByteSteps, enabled
from opstate.config import ConfigError, Settings

if TYPE_CHECKING:
    from opstate.domain.retry import RetryPolicy


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
    add_progress_flag(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "retry",
        parents=[store],
        help="retry failed rows and write final results (one pass)",
        description="One retry pass over every active lineage (docs/retry.md): first the open "
        "batches of each lineage are read from Gemini and those that ended are archived, then "
        "the next attempt is planned and created from the rows that failed for a passing "
        "reason, and a lineage with nothing left to plan gets its final result (final.jsonl). "
        "Repeat it (or run opstate serve) until every lineage is final. Prints JSON counts. "
        "--stop ROOT stops a lineage instead: nothing more is created for it, and its final "
        "result is written from what its batches returned once they have ended.",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="run one pass and exit")
    mode.add_argument(
        "--stop",
        metavar="ROOT",
        help="stop the lineage of ROOT: no more retry batches; the final result follows",
    )
    mode.add_argument(
        "--forget-cap",
        metavar="MODEL",
        help="forget the enqueued-token cap Gemini's refusals taught for MODEL (docs/jobs.md): "
        "the next jobs and retry batches of it start from OPSTATE_SUBMIT_ENQUEUED_TOKENS",
    )
    p.set_defaults(func=cmd_retry)


def add_progress_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="never draw progress (drawn only when stderr is a terminal)",
    )


def add_policy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--retry-attempts",
        type=int,
        metavar="N",
        help="retries of a request key that failed for a passing reason (0-10; default 0: "
        "no row is retried unless this flag is given)",
    )
    p.add_argument(
        "--resubmit-expired",
        action="store_true",
        default=None,
        help="resubmit the whole batch from the kept input when it ends EXPIRED (once; "
        "no row retries unless --retry-attempts is given)",
    )
    p.add_argument(
        "--pending-timeout-hours",
        type=float,
        metavar="H",
        help="cancel a batch opstate created still PENDING H hours (1-720) after Gemini's "
        "createTime, then resubmit it (once; no row retries unless --retry-attempts is given)",
    )
    p.add_argument(
        "--max-cost-usd",
        type=float,
        metavar="USD",
        help="the most the lineage may cost in all, the batch itself included (US dollars, "
        "at Batch API prices): a retry batch that would go over it is not created",
    )


def policy_body(args: argparse.Namespace, default_attempts: int = 0) -> dict[str, Any]:
    """The flags as a ``"retry"`` object (only the ones given). A flag means what it says:
    without ``--retry-attempts``, rows are retried only as the deployment's default says
    (``default_attempts``: ``OPSTATE_RETRY_MAX_ATTEMPTS``, 0 unless set), whatever the other
    flags ask (a ``"retry"`` object over HTTP keeps its documented default)."""
    body: dict[str, Any] = {}
    if getattr(args, "retry_attempts", None) is not None:
        body["maxAttempts"] = args.retry_attempts
    elif (
        getattr(args, "resubmit_expired", None)
        or getattr(args, "pending_timeout_hours", None) is not None
        or getattr(args, "max_cost_usd", None) is not None
    ):
        body["maxAttempts"] = default_attempts
    if getattr(args, "resubmit_expired", None):
        body["resubmitExpired"] = True
    if getattr(args, "pending_timeout_hours", None) is not None:
        body["pendingTimeoutHours"] = args.pending_timeout_hours
    if getattr(args, "max_cost_usd", None) is not None:
        body["maxCostUSD"] = args.max_cost_usd
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


def _local_size(source: str) -> int | None:
    """The size of a local input (``file://``), for its bars; None for any other."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(source)
    if parts.scheme != "file":
        return None
    try:
        return Path(unquote(parts.path)).stat().st_size
    except OSError:
        return None


def _fail(config: Settings, exc: Exception) -> CliError:
    error = store_error(config.store_url, exc, opened=True)
    if error is not None:
        return error
    from opstate.gemini.errors import GatewayError

    if isinstance(exc, GatewayError):
        return CliError(f"Gemini: {exc.sentence}")
    raise exc


def check_file(
    source: str,
    config: Settings,
    said: str = "nothing submitted",
    steps: ByteSteps | None = None,
) -> int | None:
    """A local input checked line by line as ``submit`` keeps it (``check_input``: the same
    check), before any key, client or write: a usage error naming the first bad line; its
    rows when good. An ``s3://`` input is checked where it is read (None: it needs AWS).
    ``steps``: its bytes drawn as "reading"."""
    if not source.startswith("file://"):
        return None
    from opstate.retry.inputs import InputError, check_input, source_chunks

    reads = source_chunks(source)
    try:
        return check_input(
            reads if steps is None else lambda: steps.read("reading", reads()),
            config.results_max_line_mib * 1024 * 1024,
        ).rows
    except InputError as exc:
        raise UsageError(f"{said}: {exc}") from None
    finally:
        if steps is not None:
            steps.close()


def retry_bound(policy: RetryPolicy, rows: int | None, config: Settings) -> int:
    """The most retry batches a lineage of this policy may create: none when the policy
    asks for nothing; one a retry attempt while the input fits in one batch
    (``OPSTATE_RETRY_MAX_ROWS``); never more than ``OPSTATE_RETRY_MAX_BATCHES``."""
    from opstate.domain.retry import enabled

    if not enabled(policy):
        return 0
    # resubmitExpired / a pending timeout resubmit while the attempt is at most max(N, 1)
    whole = policy.resubmit_expired or policy.pending_timeout_hours is not None
    attempts = max(policy.max_attempts, 1 if whole else 0)
    if rows is not None and rows <= config.retry_max_rows:
        return min(config.retry_max_batches, attempts)
    return config.retry_max_batches if attempts else 0


def policy_sentence(policy: RetryPolicy, bound: int) -> str:
    """``retry: ...`` as ``submit`` and ``track`` print the policy kept."""
    timeout = policy.pending_timeout_hours
    if bound == 0:
        return "retry: off (no retry batch will be created; flags: --retry-attempts N ...)"
    return (
        f"retry: kept policy maxAttempts {policy.max_attempts}, resubmitExpired "
        f"{'yes' if policy.resubmit_expired else 'no'}, pendingTimeoutHours "
        f"{'-' if timeout is None else f'{timeout:g}'}"
        f"{'' if policy.max_cost_usd is None else f', maxCostUSD {policy.max_cost_usd:g}'}"
        f"; this lineage creates at most {bound} "
        f"retry batch{'es' if bound != 1 else ''} (stop it: opstate retry --stop NAME)"
    )


def cmd_submit(args: argparse.Namespace) -> int:
    config = settings_for(args)
    from opstate.domain.retry import InvalidRetryError, parse_retry
    from opstate.retry.policy import settings_policy

    body = policy_body(args, config.retry_max_attempts)
    try:
        # No flag: the deployment's default as it is (0: off); a flag is the opt-in.
        policy = parse_retry(body, settings_policy(config)) if body else settings_policy(config)
    except InvalidRetryError as exc:
        raise UsageError(str(exc)) from None
    if not args.model.strip():
        raise UsageError("a model is required (--model)")
    source = input_uri(args.file)
    steps = ByteSteps(enabled(args.no_progress), size=_local_size(source))
    check_file(source, config, steps=steps)  # before the key, google-genai and any write
    require_gemini_key(config)
    from opstate.retry.inputs import InputError
    from opstate.retry.submit import PolicyChangedError
    from opstate.retry.wiring import submit_from_settings

    try:
        done = submit_from_settings(
            config,
            source=source,
            model=args.model,
            policy=policy,
            display_name=args.display_name,
            progress=steps,
        )
    except (InputError, ConfigError) as exc:
        raise UsageError(f"nothing submitted: {exc}") from None
    except PolicyChangedError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:
        raise _fail(config, exc) from None
    finally:
        steps.close()
    bound = retry_bound(policy, done.input.rows, config)
    if args.json:
        print_json(done.as_dict() | {"retry": policy.as_doc(), "retryBatchesAtMost": bound})
    else:
        verb = "submitted" if done.created else "already submitted"
        out(f"{done.name}  {verb}, {done.input.rows} requests, input kept at {done.input.location}")
        out(policy_sentence(policy, bound))
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    if args.stop is not None:
        return cmd_stop(args)
    if getattr(args, "forget_cap", None) is not None:
        return cmd_forget_cap(args)
    if not args.once:
        raise UsageError(
            "retry runs one pass and needs --once (serve and the archiver repeat it), "
            "or --stop ROOT"
        )
    config = settings_for(args)
    from opstate.retry.passes import RetryResult
    from opstate.retry.wiring import retry_from_settings
    from opstate.wiring.lineages import MembersRead, open_members, read_members

    try:
        with open_store(config, empty_if_missing=True) as store:
            if open_members(store).roots == 0:  # nothing to do for Gemini: no client, no key
                result, members = RetryResult(), MembersRead()
            else:
                require_gemini_key(config)
                members = read_members(store, config)
                result = retry_from_settings(config, every=True, store=store)
    except (ValueError, ConfigError) as exc:
        raise UsageError(str(exc)) from None
    except CliError:
        raise
    except Exception as exc:
        raise _fail(config, exc) from None
    if members.first_error is not None:
        err(f"opstate: a lineage's batch could not be read from Gemini: {members.first_error}")
    counts = result.as_dict()
    counts["errors"] += members.errors
    print_json(counts | {"read": members.read, "archived": members.archived})
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    """``opstate retry --stop ROOT``: the lineage creates nothing more; its final result is
    written (by the next passes) once the batches it has are settled."""
    config = settings_for(args)
    name = name_arg(args.stop)
    from opstate.retry.policy import StopRefusedError, stop_lineage
    from opstate.store.port import RetryingStore

    with open_store(config, must_exist=True) as store:
        if not isinstance(store, RetryingStore):  # pragma: no cover - every store of ours is
            raise CliError(f"the store {config.store_url} keeps no retry policies")
        try:
            shown = stop_lineage(store, name, time.time_ns())
        except StopRefusedError as exc:
            raise CliError(str(exc)) from None
    out(f"{name}: retry stopped ({shown}); opstate retry --once (or serve) writes its final result")
    return EXIT_OK


def cmd_forget_cap(args: argparse.Namespace) -> int:
    """``opstate retry --forget-cap MODEL``: the model's learned cap is forgotten (a job that
    learned one keeps its own; the next ones start from the setting)."""
    config = settings_for(args)
    from opstate.config import model_id
    from opstate.retry import room
    from opstate.store.counters import CountingStore

    model = model_id(args.forget_cap)
    if not model:
        raise UsageError("--forget-cap needs a model, e.g. gemini-2.5-flash")
    with open_store(config, must_exist=True) as store:
        if not isinstance(store, CountingStore):  # pragma: no cover - every store of ours is
            raise CliError(f"the store {config.store_url} keeps no counters")
        had = room.forget(store, model)
    print_json({"model": model, "forgotten": had, "cap": config.enqueued_cap(model)})
    return EXIT_OK
