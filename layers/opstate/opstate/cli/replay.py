"""``opstate replay``: ingest webhook bodies and reports from a JSONL file or stdin, or
re-ingest the signed webhook deliveries the receiver kept in its quarantine (``--quarantine``,
see ``opstate.replay``).

The input is streamed: one line is read, parsed (``strict_json``, the API's rule), turned into
an event and ingested before the next is read, so memory does not grow with the file and a pipe
is ingested as it arrives. A line is capped like an API body (``OPSTATE_MAX_BODY_BYTES``): a
longer one is read past without being kept, reported as a bad line (``line-too-long``), and
the replay goes on. The progress bar (``cli.progress``, tqdm) of a regular file counts its lines
in a first pass (only when a bar is drawn; bounded the same way).

Every line ends in exactly one of: applied or dropped (counted by reason); bad (permanent: the
line itself is wrong or the store refuses what it holds; reported with its number and skipped);
or the stop (transient: the store is unavailable, ingest gave up on contention, anything
unexpected, Ctrl-C): nothing after it is read, ``stoppedAtLine`` names it and a rerun with
``--from-line N`` resumes there. The summary is printed in every case.

Idempotent: a line's event depends only on the line. A report line without ``updateTime``
carries no server time (0, older than any real observation): it creates a record or moves it to
a higher rank, never refreshes one, so replaying a file again applies nothing and never hides an
event observed in between.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import stat
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from opstate.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    CliError,
    UsageError,
    ingest_event,
    open_store,
    out,
    print_json,
    settings_for,
)
from opstate.cli.progress import LineBar, enabled
from opstate.config import Settings
from opstate.domain.events import (
    InvalidEventError,
    UnsupportedEventError,
    from_report,
    from_webhook,
)
from opstate.domain.model import OpEvent
from opstate.domain.strict_json import InvalidJSONError, loads
from opstate.local.secret_file import DEFAULT_SECRET_FILE
from opstate.store.port import RetryableError
from opstate.terminal import printable

if TYPE_CHECKING:
    from opstate.config import Settings
    from opstate.quarantine import Quarantine
    from opstate.signatures import Verifier
    from opstate.store.port import Store

EXIT_INTERRUPTED = 130
# A report line without ``updateTime`` has no server time: older than any real observation.
NO_SERVER_TIME_NS = 0


def _line_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a line number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a line number of at least 1, got {value}")
    return value


def add_parser(
    sub: Any, *, store: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "replay",
        parents=[store, as_json],
        help="ingest webhook bodies and reports from JSONL, or quarantined webhooks",
    )
    p.add_argument("file", metavar="FILE.jsonl", nargs="?", help="a JSONL file, or - for stdin")
    p.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    p.add_argument(
        "--from-line",
        type=_line_number,
        default=1,
        metavar="N",
        help="skip the lines before line N (resume where a replay stopped)",
    )
    p.add_argument(
        "--quarantine",
        action="store_true",
        help="re-ingest the quarantined webhook deliveries instead of a file: the SQS queue "
        "(--queue-url, else OPSTATE_QUARANTINE_QUEUE_URL), else the local quarantine beside "
        "the SQLite store",
    )
    p.add_argument("--queue-url", metavar="URL", help="the quarantine SQS queue")
    p.add_argument(
        "--limit", type=int, default=1000, metavar="N", help="at most N deliveries (default 1000)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="only say which deliveries can be read now"
    )
    p.add_argument(
        "--secret-file",
        default=str(DEFAULT_SECRET_FILE),
        metavar="PATH",
        help="the local webhook secret file that verifies kept deliveries again when neither "
        f"OPSTATE_WEBHOOK_SECRET_ARN nor OPSTATE_WEBHOOK_SECRETS is set (default "
        f"{DEFAULT_SECRET_FILE})",
    )
    p.set_defaults(func=cmd_replay)


def event_from_line(obj: object, *, now_ns: int) -> OpEvent:
    """A replay line: a Gemini webhook body (has ``type``) or a report (has ``name``)."""
    if not isinstance(obj, dict):
        raise InvalidEventError("invalid-body", "the line is not a JSON object")
    if "type" in obj:
        return from_webhook(obj)
    if "name" in obj:
        body = {k: obj[k] for k in ("state", "updateTime", "details") if k in obj}
        return from_report(obj["name"], body, now_ns=now_ns)
    raise InvalidEventError(
        "missing-field", "the line is neither a webhook body ('type') nor a report ('name')"
    )


@dataclasses.dataclass
class ReplaySummary:
    file: str
    lines: int = 0
    applied: int = 0
    dropped: int = 0
    reasons: Counter[str] = dataclasses.field(default_factory=Counter)
    bad: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stopped_at: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "lines": self.lines,
            "events": self.applied + self.dropped,
            "applied": self.applied,
            "dropped": self.dropped,
            "bad": len(self.bad),
            "reasons": dict(sorted(self.reasons.items())),
            "badLines": self.bad,
            "stoppedAtLine": self.stopped_at,
        }

    def print_text(self) -> None:
        out(
            f"replayed {self.lines} lines from {self.file}: {self.applied} applied, "
            f"{self.dropped} dropped, {len(self.bad)} bad"
        )
        for reason, count in sorted(self.reasons.items()):
            out(f"  {reason:<28} {count}")
        if self.bad:
            out("bad lines: " + ", ".join(str(b["line"]) for b in self.bad))
        if self.stopped_at is not None:
            out(f"stopped at line {self.stopped_at}")


def _open_input(path: str) -> tuple[BinaryIO, str]:
    if path == "-":
        return sys.stdin.buffer, "<stdin>"
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed by cmd_replay
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(os.fstat(stream.fileno()).st_mode):
        stream.close()
        raise CliError(f"cannot read {path}: it is a directory, not a JSONL file")
    return stream, path


_DRAIN_CHUNK = 64 * 1024


def read_line(stream: BinaryIO, limit: int) -> bytes | None:
    """The next line (b"" at the end); None for a line longer than ``limit`` bytes (without
    its line break), which is read past in chunks, never held whole."""
    raw = stream.readline(limit + 1)
    if len(raw) <= limit or raw.endswith(b"\n"):
        return raw
    while True:
        chunk = stream.readline(_DRAIN_CHUNK)
        if not chunk or chunk.endswith(b"\n"):
            return None


def _count_lines(stream: BinaryIO, from_line: int, limit: int) -> int | None:
    """Non-blank lines from ``from_line`` on of a regular file (then rewound), else None."""
    try:
        if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            return None
        start = stream.tell()
        total, lineno = 0, 0
        while (raw := read_line(stream, limit)) != b"":
            lineno += 1
            if lineno >= from_line and (raw is None or raw.strip()):
                total += 1
        stream.seek(start)
    except (OSError, ValueError):
        return None
    return total


def _lines(stream: BinaryIO, label: str, limit: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes, or None for a line over ``limit``) one at a time; a read error is
    a ``CliError``."""
    lineno = 0
    while True:
        try:
            raw = read_line(stream, limit)
        except OSError as exc:
            raise CliError(
                f"cannot read {label} after line {lineno}: {exc.strerror or exc}"
            ) from None
        if raw == b"":
            return
        lineno += 1
        yield lineno, raw


def store_refusal(exc: BaseException) -> str | None:
    """Why the store refused this line's record for good, or None when the failure is not
    about the line (then the replay stops there, and a rerun can go on)."""
    if isinstance(exc, RetryableError):
        return None
    if type(exc).__module__.startswith("botocore"):
        response = getattr(exc, "response", None)
        code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
        if code == "ValidationException" or type(exc).__name__ == "ParamValidationError":
            message = response.get("Error", {}).get("Message") if response else None
            return f"the store refused the record ({message or exc})"
        return None
    if isinstance(exc, RecursionError):
        return "the store refused the record (details nested too deeply)"
    if isinstance(exc, ArithmeticError | ValueError | TypeError):
        return f"the store refused the record ({type(exc).__name__}: {str(exc)[:200]})"
    return None


def _one_line(
    lineno: int,
    raw: bytes | None,
    store: Store,
    config: Settings,
    summary: ReplaySummary,
    bad: Callable[[int, str, str], None],
) -> str | None:
    """Handle one non-blank line; returns why the replay must stop here, else None."""
    if raw is None:
        bad(
            lineno,
            "line-too-long",
            f"the line is longer than {config.max_body_bytes} bytes (OPSTATE_MAX_BODY_BYTES)",
        )
        return None
    try:
        obj = loads(raw)
    except InvalidJSONError as exc:
        bad(lineno, "invalid-json", f"the line is not JSON ({exc.message})")
        return None
    try:
        event = event_from_line(obj, now_ns=NO_SERVER_TIME_NS)
    except UnsupportedEventError as exc:
        summary.dropped += 1
        summary.reasons[exc.reason] += 1
        return None
    except InvalidEventError as exc:
        bad(lineno, exc.code, exc.message)
        return None
    try:
        decision = ingest_event(store, event, config)
    except Exception as exc:
        refusal = store_refusal(exc)
        if refusal is None:
            what = "the store did not accept it" if isinstance(exc, RetryableError) else "it failed"
            return f"{what} ({type(exc).__name__}: {str(exc).strip()[:300]})"
        bad(lineno, "store-rejected", refusal)
        return None
    if decision.reason == "store-rejected":  # refused for good by the store (ingest dropped it)
        bad(lineno, "store-rejected", "the store refused the record")
        return None
    if decision.applied:
        summary.applied += 1
    else:
        summary.dropped += 1
    summary.reasons[str(decision.reason)] += 1
    return None


def cmd_replay(args: argparse.Namespace) -> int:
    config = settings_for(args)
    if args.quarantine or args.queue_url:
        if args.file is not None:
            raise UsageError("give a FILE or --quarantine, not both")
        return cmd_replay_quarantine(args, config)
    if args.file is None:
        raise UsageError("give a FILE.jsonl (or - for stdin), or --quarantine")
    stream, label = _open_input(args.file)
    try:
        return _replay(args, config, stream, label)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _replay(args: argparse.Namespace, config: Settings, stream: BinaryIO, label: str) -> int:
    interactive = enabled(args.no_progress)
    limit = config.max_body_bytes
    total = _count_lines(stream, args.from_line, limit) if interactive else None
    progress = LineBar(total, interactive)
    summary = ReplaySummary(file=label)
    failure: CliError | None = None

    def bad(lineno: int, code: str, message: str) -> None:
        summary.bad.append({"line": lineno, "error": code, "message": message})
        progress.message(f"{label}:{lineno}: {message} (skipped)")

    def stop(lineno: int, why: str, code: int = EXIT_FAILURE) -> CliError:
        summary.stopped_at = lineno
        return CliError(
            f"stopped at line {lineno} of {label}: {why}; the lines before it are in the store, "
            f"rerun with --from-line {lineno} to resume (replaying the whole file is safe too)",
            code,
        )

    with open_store(config) as store:
        last = 0  # the last line fully handled
        try:
            for lineno, raw in _lines(stream, label, limit):
                if lineno < args.from_line or (raw is not None and not raw.strip()):
                    last = lineno
                    continue
                outcome = _one_line(lineno, raw, store, config, summary, bad)
                if outcome is not None:
                    failure = stop(lineno, outcome)
                    break
                summary.lines += 1
                progress.advance()
                last = lineno
        except KeyboardInterrupt:
            failure = stop(last + 1, "interrupted", EXIT_INTERRUPTED)
        except CliError as exc:  # the input could not be read further
            summary.stopped_at = last + 1
            failure = exc
    progress.clear()
    if args.json:
        print_json(summary.as_dict())
    else:
        summary.print_text()
    if failure is not None:
        raise failure
    return EXIT_FAILURE if summary.bad else EXIT_OK


def quarantine_for(args: argparse.Namespace, config: Settings) -> tuple[Quarantine, str]:
    """The quarantine ``--queue-url`` / ``OPSTATE_QUARANTINE_QUEUE_URL`` names, else the local
    one beside the SQLite store; and a label for it."""
    from opstate.quarantine import SqsQuarantine, local_quarantine

    queue_url = getattr(args, "queue_url", None) or config.quarantine_queue_url
    if queue_url:
        return SqsQuarantine(queue_url), queue_url
    local = local_quarantine(config.store_url)
    return local, str(local.path)


def replay_verifier(config: Settings, secret_file: Path) -> Verifier:
    """What verifies kept deliveries again: the configured webhook secrets (Secrets Manager,
    ``OPSTATE_WEBHOOK_SECRETS``, else the local secret file ``opstate serve`` uses) and the JWT
    verifier when ``OPSTATE_PUBLIC_URL`` is set; no timestamp tolerance, no token expiry."""
    from opstate.signatures import verifier_from_settings
    from opstate.webhook_secrets import read_secret_file

    if not config.webhook_secret_arn and not config.webhook_secrets:
        try:
            keys = read_secret_file(secret_file).keys
        except FileNotFoundError:
            keys = ()
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot read the webhook secret to verify with: {exc}") from None
        if not keys and not config.public_url:
            raise CliError(
                "no webhook secret to verify the quarantined deliveries with: set "
                "OPSTATE_WEBHOOK_SECRET_ARN or OPSTATE_WEBHOOK_SECRETS, or give --secret-file "
                f"(default {DEFAULT_SECRET_FILE})"
            )
        config = dataclasses.replace(config, webhook_secrets=keys)
    return verifier_from_settings(config, replaying=True)


def cmd_replay_quarantine(args: argparse.Namespace, config: Settings) -> int:
    """Re-ingest kept deliveries that verify again (``opstate.replay``); exit 1 if some are
    still unreadable, refused or could not be ingested (they stay kept)."""
    from opstate.replay import replay

    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    verifier = replay_verifier(config, Path(args.secret_file))
    quarantine, label = quarantine_for(args, config)
    with open_store(config) as store:
        result = replay(
            quarantine,
            store,
            verifier=verifier,
            limit=args.limit,
            max_attempts=config.ingest_max_attempts,
            dry_run=args.dry_run,
        )
    if args.json:
        print_json({"quarantine": label, "dryRun": args.dry_run, **result.to_json()})
    else:
        verb = "would replay" if args.dry_run else "replayed"
        out(
            f"{verb} {result.taken} quarantined deliveries from {label}: {result.applied} "
            f"{'readable' if args.dry_run else 'applied'}, {result.dropped} dropped, "
            f"{result.unreadable} still unreadable, {result.refused} refused (not verified), "
            f"{result.errors} failed"
        )
        for delivery_id, code, message in result.problems:
            out(f"  {delivery_id} {code}: {printable(message[:200])}")
    return EXIT_FAILURE if result.unreadable or result.refused or result.errors else EXIT_OK
